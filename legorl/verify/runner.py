"""The hardened pytest invocation used to grade (and, when generating tasks, to label) tests.

What the repository under test could otherwise do to the runner, and what stops it:
- shadow pytest or its dependencies (`pytest.py`, `_pytest/` in the repo): the runner is
  imported by a small bootstrap script *before* the repository is on `sys.path`, and the
  repository is then appended (not prepended) to `sys.path`, with `--import-mode=append`;
- start-up hooks (`sitecustomize`, `usercustomize`, `.pth`) and environment variables
  (`PYTHONPATH`, `PYTEST_ADDOPTS`, `PYTEST_PLUGINS`): `python -I` (isolated: no user site,
  no `PYTHON*` variables, no script directory on the path) under `env -i`;
- installed plugins that the repository could register through entry points:
  `PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`;
- stale or planted byte code: `-B` and the grader deletes `__pycache__` before the run;
- a cache that survives between runs: `-p no:cacheprovider`;
- rewritten reports: results are read from a JUnit XML written to a random path outside
  the repository, and a pair of canary tests (one must pass, one must fail) under a random
  name shows whether reporting was tampered with; the bootstrap leaves with `os._exit`, so
  `atexit` hooks of the code under test never run after the report is written;
- an early `os._exit(0)`: no report is written, so every test counts as missing (failed),
  and the exit code 0 contradicts the canary that must fail.
"""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_BOOTSTRAP = '''\
import os
import sys

sys.dont_write_bytecode = True
import pytest  # imported while the repository is not yet on sys.path

sys.path.append({repo!r})
try:
    code = int(pytest.main({args!r}))
except BaseException:  # raised by the code under test; the report decides what happened
    import traceback

    traceback.print_exc()
    code = 3
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
'''

_CANARY = '''\
def test_{nonce}_pass():
    assert True


def test_{nonce}_fail():
    assert False, "canary"
'''


class TestCmdError(ValueError):
    """A task's test_cmd is not a pytest command line we can run."""

    __test__ = False


def parse_test_cmd(test_cmd: str) -> list[str]:
    """The pytest arguments of `test_cmd` (`pytest ARGS`, `python -m pytest ARGS`, …)."""
    try:
        words = shlex.split(test_cmd)
    except ValueError as exc:
        raise TestCmdError(f"test_cmd is not valid shell syntax: {exc}") from None
    if words[:1] in (["pytest"], ["py.test"]):
        return words[1:]
    if len(words) >= 3 and words[0].startswith("python") and words[1:3] == ["-m", "pytest"]:
        return words[3:]
    raise TestCmdError(
        f"test_cmd must start with `pytest` or `python -m pytest` (other runners are not supported), got {test_cmd!r}"
    )


def default_test_args(test_ids: list[str]) -> list[str]:
    """Run just the files that hold the given tests (SWE-bench's 'test directives')."""
    return sorted({t.split("::", 1)[0] for t in test_ids})


@dataclass(frozen=True)
class RunnerPlan:
    """Everything one hardened test run needs: files to write and the command to execute."""

    work_dir: str  # outside the repository, random name
    junit_path: str
    script_path: str
    script: str
    canary_path: str  # absolute, inside the repository (so its configuration applies)
    canary_source: str
    canary_pass: str  # node ids of the canaries
    canary_fail: str
    command: str  # shell command; run with cwd = the repository

    @property
    def files(self) -> dict[str, str]:
        return {self.script_path: self.script, self.canary_path: self.canary_source}


def plan_run(repo: str, args: list[str], python: str = "python3", tmp_root: str = "/tmp") -> RunnerPlan:
    """Plan a hardened run of `pytest ARGS` in `repo` with a fresh random nonce."""
    nonce = secrets.token_hex(8)
    work = f"{tmp_root.rstrip('/')}/.lg-{secrets.token_hex(8)}"
    junit = f"{work}/{secrets.token_hex(8)}.xml"
    canary_rel = f".lg-{nonce}/test_{nonce}.py"
    full_args = [
        *args,
        canary_rel,
        f"--rootdir={repo}",
        "--import-mode=append",
        "--continue-on-collection-errors",
        "-p",
        "no:cacheprovider",
        "-o",
        "junit_family=xunit1",
        "-o",
        "console_output_style=classic",
        f"--junitxml={junit}",
        "--tb=short",
        "-q",
    ]
    script = _BOOTSTRAP.format(repo=repo, args=full_args)
    env = [
        "env",
        "-i",
        f"PATH={SAFE_PATH}",
        f"HOME={work}/home",
        f"TMPDIR={work}/tmp",
        "LANG=C.UTF-8",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1",
    ]
    command = (
        f"mkdir -p {shlex.quote(work)}/home {shlex.quote(work)}/tmp && "
        f"cd {shlex.quote(repo)} && exec {shlex.join(env)} {shlex.quote(python)} -I -B {shlex.quote(work)}/run.py"
    )
    return RunnerPlan(
        work_dir=work,
        junit_path=junit,
        script_path=f"{work}/run.py",
        script=script,
        canary_path=f"{repo.rstrip('/')}/{canary_rel}",
        canary_source=_CANARY.format(nonce=nonce),
        canary_pass=f"{canary_rel}::test_{nonce}_pass",
        canary_fail=f"{canary_rel}::test_{nonce}_fail",
        command=command,
    )
