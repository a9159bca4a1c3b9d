"""What a task's `test_cmd` names: pytest or one of the native runners, and whether grading
can harden it.

pytest command lines go to the pytest path (`parse_test_cmd` here, then `selection.py` and
`pytest_plan.py`). Two repositories' own runners are supported natively, as the official
SWE-bench specs run them:
- Django: `./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 LABELS`
  (unittest underneath);
- SymPy: `bin/test -C --verbose FILES` (`sympy.testing.runtests`).
Each is run under `in_sandbox/native_main.py` with a recorder at the innermost call of every
test. Options that would escape the recorder or end the run early are refused or forced:
Django always runs `--parallel 1` (worker processes would run tests out of the
recorder's sight), SymPy always `--no-subprocess` (same reason; the hash seed is random
in the one process anyway). Any other runner is refused with its name: we cannot vouch
for a verdict we cannot confirm.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass


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


HARDENED = "pytest, Django's tests/runtests.py, SymPy's bin/test"
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
ALLOWED_ENV = frozenset({"PYTHONWARNINGS"})
# Files that decide how a native runner runs: restored from the task like its tests.
RUNNER_FILES = {
    "django": ("tests/runtests.py", "tests/test_sqlite.py"),
    "sympy": ("bin/test", "sympy/testing/runtests.py", "sympy/testing/pytest.py", "sympy/utilities/runtests.py"),
}
_REFUSED = {
    "django": {
        "--failfast": "stops at the first failure",
        "--bisect": "bisects instead of running",
        "--pair": "runs pairs instead of the tests",
        "--pdb": "drops into a debugger",
        "--selenium": "needs browsers",
        "--debug-sql": "changes the output the parser reads",
        "-b": "buffers the output the parser reads",
        "--buffer": "buffers the output the parser reads",
    },
    "sympy": {
        "--pdb": "drops into a debugger",
        "-x": "stops at the first failure",
        "--subprocess": "runs the tests out of the recorder's sight",
        "--parallel": "splits the run",
    },
}


@dataclass(frozen=True)
class NativeCommand:
    """A native runner's command line, hardened."""

    runner: str  # "django" or "sympy"
    script: str  # repo-relative entry script
    args: list[str]  # options (hardened) then labels
    labels: list[str]  # the test directives: Django test labels or SymPy test files
    warnings: list[str]  # PYTHONWARNINGS entries (`python -I` ignores the variable itself)

    @property
    def recorder(self) -> str:
        return "unittest" if self.runner == "django" else "sympy"


def _strip_python(words: list[str]) -> list[str]:
    if words and re.fullmatch(r"(/usr/bin/)?python(3(\.\d+)?)?", words[0]):
        return words[1:]
    return words


def native_command(test_cmd: str) -> NativeCommand | None:
    """The native runner `test_cmd` names (None: a pytest command line); TestCmdError when
    it names a runner grading cannot harden (its name in the message) or a refused option."""
    try:
        words = shlex.split(test_cmd)
    except ValueError as exc:
        raise TestCmdError(f"test_cmd is not valid shell syntax: {exc}") from None
    env: dict[str, str] = {}
    while words and _ENV.match(words[0]):
        k, _, v = words.pop(0).partition("=")
        if k not in ALLOWED_ENV:
            raise TestCmdError(
                (
                    f"test_cmd sets {k}, which grading cannot pass to the runner (allowed: "
                    f"{', '.join(sorted(ALLOWED_ENV))})"
                )
            )
        env[k] = v
    if not words:
        raise TestCmdError(f"test_cmd names no command: {test_cmd!r}")
    first = words[0]
    if first in ("pytest", "py.test") or (
        len(words) >= 3 and first.startswith("python") and words[1:3] == ["-m", "pytest"]
    ):
        if env:
            raise TestCmdError("test_cmd: environment assignments are only supported for native runners")
        return None
    words = _strip_python(words)
    script = words[0].removeprefix("./") if words else ""
    if script == "tests/runtests.py":
        runner = "django"
    elif script == "bin/test":
        runner = "sympy"
    else:
        name = words[0] if words else first
        raise TestCmdError(f"test runner {name!r} cannot be hardened for grading (supported: {HARDENED})")
    opts: list[str] = []
    labels: list[str] = []
    rest = words[1:]
    i = 0
    while i < len(rest):
        w = rest[i]
        name = w.split("=", 1)[0]
        if name in _REFUSED[runner]:
            raise TestCmdError(f"test_cmd option {w!r} cannot be used for grading: {_REFUSED[runner][name]}")
        if runner == "django" and name in ("--parallel", "--verbosity", "-v"):
            i += 1 if "=" in w else 2  # forced below
            continue
        if w.startswith("-"):
            opts.append(w)
            if (
                runner == "django"
                and "=" not in w
                and name in ("--settings", "--tag", "--exclude-tag", "-k")
                and i + 1 < len(rest)
            ):
                opts.append(rest[i + 1])
                i += 1
        else:
            labels.append(w)
        i += 1
    if runner == "django":
        opts += ["--verbosity", "2", "--parallel", "1"]
    else:
        opts = [o for o in opts if o != "--no-subprocess"] + ["--no-subprocess"]
        if "--verbose" not in opts and "-v" not in opts:
            opts.append("--verbose")
    warns = [w for w in env.get("PYTHONWARNINGS", "").split(",") if w]
    return NativeCommand(runner, script, [*opts, *labels], labels, warns)


def django_label_covers(label: str, test_id: str) -> bool:
    """Does a Django test label (`app.tests`, `app.tests.Class`) select the test id
    `test_x (app.tests.Class.test_x)` or `test_x (app.tests.Class)`?"""
    m = re.match(r"^\S+ \((\S+)\)$", test_id)
    dotted = m.group(1) if m else test_id
    return dotted == label or dotted.startswith(label + ".")


def django_test_file(test_id: str) -> str | None:
    """The file of a Django test id: `tests/<module path>.py` of its dotted class path."""
    m = re.match(r"^(\S+) \((\S+)\)$", test_id)
    if not m:
        return None
    parts = m.group(2).split(".")
    if parts[-1] == m.group(1):
        parts = parts[:-1]
    return "tests/" + "/".join(parts[:-1]) + ".py" if len(parts) >= 2 else None


def django_class(test_id: str) -> str | None:
    """The test class of a Django test id (either format)."""
    m = re.match(r"^(\S+) \((\S+)\)$", test_id)
    if not m:
        return None
    parts = m.group(2).split(".")
    return parts[-2] if parts[-1] == m.group(1) and len(parts) > 1 else parts[-1]
