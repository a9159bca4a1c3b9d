"""What the official SWE-bench package (`swebench`, pinned in pyproject) defines, as we use it.

Since swebench 5, the per-repository/version spec tables (`MAP_REPO_VERSION_TO_SPECS`) are
gone from the package: each published instance carries its own `eval_script` (the
script whose test command sits between the `>>>>> Start/End Test Output` markers),
`log_parser` (a key of `PARSER_REGISTRY`) and `image`. The package still maps a Python
repository to its parser (`MAP_REPO_TO_PARSER_PY`). So a task's test command is, in order:
our own `test_cmd`, else the test command of its `eval_script`; its log parser is its
`log_parser`, else the repository's. Anything else is a per-task error at load.

`swebench.harness/__init__.py` imports its Docker, Modal and `datasets` modules eagerly;
the modules we need (constants, log parsers, the `TestSpec` type) import only the standard
library, so they are loaded without that `__init__` (it is installed `--no-deps` by
scripts/setup_swebench.sh, keeping docker/modal/datasets out of the venv).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from collections.abc import Callable
from functools import cache
from typing import Any

PINNED = "5.0.2"
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"


class OfficialUnavailable(RuntimeError):
    """The swebench package is not installed (scripts/setup_swebench.sh installs it)."""


@cache
def _harness() -> tuple[Any, Any, Any]:
    """(constants, log_parsers, types) modules of the installed swebench package."""
    spec = importlib.util.find_spec("swebench")
    if spec is None or not spec.submodule_search_locations:
        raise OfficialUnavailable(
            f"the swebench package is not installed (run scripts/setup_swebench.sh; pinned {PINNED})"
        )
    if "swebench.harness" not in sys.modules:  # skip its __init__ (docker, modal, datasets)
        pkg = types.ModuleType("swebench.harness")
        pkg.__path__ = [p + "/harness" for p in spec.submodule_search_locations]
        sys.modules["swebench.harness"] = pkg
    return (
        importlib.import_module("swebench.harness.constants"),
        importlib.import_module("swebench.harness.log_parsers"),
        importlib.import_module("swebench.types"),
    )


def version() -> str:
    from importlib.metadata import version as v

    return v("swebench")


def parser_name(repo: str, log_parser: str = "") -> str | None:
    """The PARSER_REGISTRY key for an instance: its own, else its repository's."""
    _, parsers, _ = _harness()
    if log_parser:
        return log_parser if log_parser in parsers.PARSER_REGISTRY else None
    py = importlib.import_module("swebench.harness.log_parsers.python")
    fn = py.MAP_REPO_TO_PARSER_PY.get(repo)
    if fn is None:
        return None
    return next((k for k, v in parsers.PARSER_REGISTRY.items() if v is fn), None)


def parser(name: str) -> Callable[[str, Any], dict[str, str]]:
    _, parsers, _ = _harness()
    return parsers.PARSER_REGISTRY[name]


def parse_log(name: str, log: str, instance_id: str, repo: str, f2p: list[str], p2p: list[str]) -> dict[str, str]:
    """{test: PASSED/FAILED/ERROR/SKIPPED/XFAIL} as the official parser reads `log`."""
    _, _, tmod = _harness()
    spec = tmod.TestSpec(
        instance_id=instance_id,
        image="",
        eval_script_list=[],
        repo=repo,
        version="",
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        log_parser=name,
    )
    return dict(parser(name)(log, spec))


def eval_test_cmd(eval_script: str) -> str | None:
    """The test command of an official eval script: the lines between its output markers."""
    if START not in eval_script or END not in eval_script:
        return None
    body = eval_script.split(START, 1)[1].split(END, 1)[0]
    lines = [ln.strip() for ln in body.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("#", ":", "echo", "'", '"'))]
    lines = [re.sub(r"\s*;?\s*$", "", ln) for ln in lines]
    return lines[-1] if lines else None
