"""Which paths of a repository the agent may not change for grading, and why.

Grading never trusts the agent with anything that decides how tests run: the tests
themselves, pytest's configuration, interpreter start-up hooks, modules that could shadow
the runner, and compiled code that would be imported instead of the reviewed source. A
change to any of these is dropped from the agent's diff and the path is restored to the
task's own version before the tests run (see `verify/apply.py`).

Categories (each becomes evidence; `tamper` also becomes the `tamper_attempt` flag):
- `test`: a test file or anything under a `tests/`/`test/` directory. Agents edit tests for
  honest reasons too (adding a regression test), so this is recorded, not punished.
- `test_config`: files whose pytest sections change collection or options
  (`pytest.ini`, `.pytest.ini`, `tox.ini`, `setup.cfg`, `pyproject.toml`), and git's own
  `.gitattributes`/`.gitmodules`, which change how the grader's git checks files out.
- `tamper`: `conftest.py`, `sitecustomize.py`/`usercustomize.py`, `*.pth`, modules or
  packages named like the runner (`pytest`, `_pytest`, `pluggy`, `py`, `iniconfig`), and
  byte-code or native modules (`*.pyc`, `__pycache__/`, `*.so`, `*.pyd`) that Python would
  import in place of the `.py` next to them. No bug fix needs these.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Iterable
from pathlib import PurePosixPath


class Category(enum.StrEnum):
    TEST = "test"
    TEST_CONFIG = "test_config"
    TAMPER = "tamper"


TEST_DIRS = frozenset({"tests", "test"})
TEST_FILE_GLOBS = ("test_*.py", "*_test.py", "*_tests.py", "tests.py")
TEST_CONFIG_FILES = frozenset(
    {"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", ".gitattributes", ".gitmodules"}
)
STARTUP_HOOKS = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py"})
RUNNER_NAMES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig"})
COMPILED_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")


def classify(path: str, extra_tests: Iterable[str] = ()) -> Category | None:
    """The category of a repository-relative path, or None if the agent may change it.

    `extra_tests` are paths that are tests for this task whatever their name (the files
    touched by the task's test_patch and those holding its FAIL_TO_PASS/PASS_TO_PASS tests).
    """
    p = PurePosixPath(path.lstrip("/"))
    parts = p.parts
    if not parts:
        return None
    name = parts[-1]
    dirs = parts[:-1]
    # Tamper first: a conftest.py inside tests/ is still a conftest.py.
    if name in STARTUP_HOOKS or name.endswith(".pth"):
        return Category.TAMPER
    if "__pycache__" in parts or name.endswith(COMPILED_SUFFIXES):
        return Category.TAMPER
    if any(d in RUNNER_NAMES for d in dirs):
        return Category.TAMPER
    stem = name[:-3] if name.endswith(".py") else None
    if stem in RUNNER_NAMES or name in RUNNER_NAMES:
        return Category.TAMPER
    if name in TEST_CONFIG_FILES:
        return Category.TEST_CONFIG
    if any(d in TEST_DIRS for d in dirs):
        return Category.TEST
    if any(fnmatch.fnmatchcase(name, g) for g in TEST_FILE_GLOBS):
        return Category.TEST
    normalized = str(p)
    if any(normalized == str(PurePosixPath(e.lstrip("/"))) for e in extra_tests):
        return Category.TEST
    return None


def test_files_of(test_ids: Iterable[str]) -> set[str]:
    """The files that hold the given pytest node ids (`a/b.py::T::t[x]` → `a/b.py`)."""
    return {tid.split("::", 1)[0] for tid in test_ids if "::" in tid}
