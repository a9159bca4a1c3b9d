"""Which tests a grading run selects, with SWE-bench's semantics.

SWE-bench runs a task's test command *plus* the test directives: the test files its
`test_patch` touches. Many task files carry just the runner and its flags
(`python -m pytest -q`, `pytest -rA --tb=long`); appending anything of our own to such a
command would leave the grader's file as the only path, so pytest would collect nothing
else and every FAIL_TO_PASS test would be missing. So a `test_cmd` is split into
its runner flags and its paths: when it names paths they are the directives, otherwise the
directives are the files of the task's FAIL_TO_PASS/PASS_TO_PASS tests and the test files
its `test_patch` touches. The grader's own canaries go *into* one of those files (see
`pytest_plan.py`), so they never change which task tests run.

As stage 1 of grading (`select`, called once by `grade.grade_in`) it also decides, from
the task alone, what the later stages need: the paths that are this task's tests whatever
their names (`task_test_files`, protected in stages 2 and 3), the native runner if the
test_cmd names one, and the task test file the canaries are planted in.

`selection_problems` is the load-time check (`legorl tasks validate` and every task load):
a task whose tests cannot all be selected this way is rejected with the reason, instead of
being graded 0 for every fix.
"""

from __future__ import annotations

import fnmatch
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from legorl.types import Task
from legorl.verify.attempt import GraderFault
from legorl.verify.patch import split_diff
from legorl.verify.protect import TEST_FILE_GLOBS, test_files_of
from legorl.verify.test_command import (
    RUNNER_FILES,
    NativeCommand,
    TestCmdError,
    django_class,
    django_label_covers,
    django_test_file,
    native_command,
    parse_test_cmd,
)

# pytest options that take a separate value (`-k expr`, `--tb short`); their value is not a path.
VALUE_OPTIONS = frozenset(
    {
        "-k",
        "-m",
        "-o",
        "-c",
        "-W",
        "-r",
        "--tb",
        "--deselect",
        "--ignore",
        "--ignore-glob",
        "--rootdir",
        "--confcutdir",
        "--override-ini",
        "--maxfail",
        "--durations",
        "--durations-min",
        "--log-level",
        "--log-format",
        "--log-date-format",
        "--log-cli-level",
        "--log-file",
        "--log-file-level",
        "--basetemp",
        "--import-mode",
        "--capture",
        "--color",
        "--code-highlight",
        "--assert",
        "--show-capture",
        "--junit-prefix",
        "--doctest-glob",
        "--doctest-report",
        "--inifile",
        "--config-file",
        "--verbosity",
    }
)
# Options grading cannot honour: they stop at the first failure (the grader's must-fail
# canary would end the run), replace the report or the plugins, or do not run tests at all.
REFUSED_OPTIONS = {
    "-x": "stops at the first failure, so later tests would be missing",
    "--exitfirst": "stops at the first failure, so later tests would be missing",
    "--maxfail": "stops after N failures, so later tests would be missing",
    "--sw": "stepwise runs stop at the first failure",
    "--stepwise": "stepwise runs stop at the first failure",
    "--lf": "reruns only earlier failures (there is no cache when grading)",
    "--last-failed": "reruns only earlier failures (there is no cache when grading)",
    "--co": "collects without running",
    "--collect-only": "collects without running",
    "--pdb": "drops into a debugger",
    "--trace": "drops into a debugger",
    "--junitxml": "the grader writes the report",
    "--junit-xml": "the grader writes the report",
    "-p": "plugins are loaded by the grader only",
    "--pyargs": "directives must be file paths",
    "-n": "pytest-xdist is not loaded when grading",
    "--numprocesses": "pytest-xdist is not loaded when grading",
}
NON_TEST_SUFFIXES = (
    ".json",
    ".png",
    ".csv",
    ".txt",
    ".md",
    ".rst",
    ".jpg",
    ".jpeg",
    ".pkl",
    ".yml",
    ".yaml",
    ".toml",
    ".cfg",
    ".ini",
)


@dataclass(frozen=True)
class TestSelection:
    """The pytest arguments of one grading run: the task's flags, then its directives."""

    __test__ = False

    flags: list[str]  # from test_cmd, in order (`-o addopts=`, `-q`, …)
    directives: list[str]  # test files/dirs/node ids, repo-relative
    from_test_cmd: bool  # the directives are test_cmd's own

    @property
    def args(self) -> list[str]:
        return [*self.flags, *self.directives]


def split_args(words: list[str]) -> tuple[list[str], list[str]]:
    """(flags, paths) of pytest's arguments; an option's separate value stays a flag."""
    flags: list[str] = []
    paths: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":
            paths += words[i + 1 :]
            break
        if w.startswith("-") and w != "-":
            flags.append(w)
            name = w.split("=", 1)[0]
            # `-k expr` takes the next word; `-kexpr`, `--tb=short` carry their value
            if "=" not in w and (name in VALUE_OPTIONS or name == "-p") and i + 1 < len(words):
                flags.append(words[i + 1])
                i += 1
            i += 1
            continue
        paths.append(w)
        i += 1
    return flags, paths


def _is_test_file(path: str) -> bool:
    name = PurePosixPath(path).name
    return path.endswith(".py") and any(fnmatch.fnmatchcase(name, g) for g in TEST_FILE_GLOBS)


def patch_directives(test_patch: str) -> list[str]:
    """The test files a test_patch touches (SWE-bench's directives, minus data files)."""
    sections, _ = split_diff(test_patch)
    paths = {p for sec in sections for p in sec.paths}
    return sorted(p for p in paths if not p.endswith(NON_TEST_SUFFIXES) and _is_test_file(p))


def select_tests(task: Task) -> TestSelection:
    """The pytest arguments that run this task's tests (raises TestCmdError for a bad test_cmd)."""
    words = parse_test_cmd(task.test_cmd) if task.test_cmd.strip() else []
    flags, paths = split_args(words)
    if paths:
        return TestSelection(flags, paths, True)
    files = test_files_of(task.FAIL_TO_PASS) | test_files_of(task.PASS_TO_PASS) | set(patch_directives(task.test_patch))
    return TestSelection(flags, sorted(files), False)


def covers(directive: str, test_id: str) -> bool:
    """Does the directive (file, directory or node id) select the test?"""
    d = directive.rstrip("/")
    if d in (".", ""):
        return True
    if "::" in d:
        return test_id == d or test_id.startswith((d + "::", d + "["))
    file = test_id.split("::", 1)[0]
    return file == d or file.startswith(d + "/")


def selection_problems(task: Task) -> list[str]:
    """Why this task's tests cannot be selected for grading (empty: they can)."""
    try:
        words = parse_test_cmd(task.test_cmd) if task.test_cmd.strip() else []
    except TestCmdError as exc:
        return [str(exc)]
    problems: list[str] = []
    flags, _ = split_args(words)
    for i, f in enumerate(flags):
        if not f.startswith("-") or (i > 0 and flags[i - 1] in VALUE_OPTIONS | {"-p"}):
            continue  # a value, not an option
        name = f.split("=", 1)[0]
        short = name[:2] if not name.startswith("--") else name
        if short == "-p":  # `-p no:NAME` only disables a plugin; loading one is refused
            value = f[2:] if len(f) > 2 else (flags[i + 1] if i + 1 < len(flags) else "")
            if value.startswith("no:"):
                continue
        reason = REFUSED_OPTIONS.get(name) or REFUSED_OPTIONS.get(short)
        if reason:
            problems.append(f"test_cmd option {f!r} cannot be used for grading: {reason}")
    for tid in task.FAIL_TO_PASS + task.PASS_TO_PASS:
        file = tid.split("::", 1)[0]
        p = PurePosixPath(file)
        if p.is_absolute() or ".." in p.parts or not file:
            problems.append(f"test {tid!r}: its file must be a path inside the repository")
    if problems:
        return problems
    sel = select_tests(task)
    if not sel.directives:
        problems.append("no test paths: test_cmd names none and FAIL_TO_PASS/PASS_TO_PASS/test_patch give none")
    for d in sel.directives:
        p = PurePosixPath(d.split("::", 1)[0])
        if p.is_absolute() or ".." in p.parts:
            problems.append(f"test_cmd path {d!r} must be inside the repository")
    uncovered = [t for t in task.FAIL_TO_PASS + task.PASS_TO_PASS if not any(covers(d, t) for d in sel.directives)]
    if uncovered:
        problems.append(
            f"{len(uncovered)} FAIL_TO_PASS/PASS_TO_PASS tests are not selected by test_cmd's paths "
            f"{sel.directives}: {uncovered[:3]}"
        )
    return problems


def shell_args(sel: TestSelection) -> str:
    """The selection as a command line (for evidence and error messages)."""
    return shlex.join(["pytest", *sel.args])


# Stage 1 of grading (`grade.py`): everything about the task's tests that the later stages
# need, decided once from the task alone, before the sandbox is touched.


@dataclass(frozen=True)
class Selection:
    """Which tests a grading attempt runs, by which runner, and where the canaries go."""

    __test__ = False

    protected: list[str]  # paths that are tests for this task whatever their names (`task_test_files`)
    native: NativeCommand | None  # the task's own runner, or None for pytest
    pytest: TestSelection | None  # pytest's arguments (None for a native runner)
    host: str | None  # the task test file the canaries are planted in
    like: list[str]  # its tests' function names (canaries are named like them)
    like_classes: list[str]  # its test classes' names (Django)
    fault: str = ""  # a task whose tests cannot run: raised as a GraderFault("select") at the run stage

    def check(self) -> None:
        """Raise the task's selection fault, if any (the run stage calls this first, so the
        agent's diff is applied and judged exactly as far as it would be for a good task)."""
        if self.fault:
            raise GraderFault("select", self.fault)


def select(task: Task) -> Selection:
    """Stage 1: the task's tests, the paths that protect them, the runner and the canaries' host."""
    protected = task_test_files(task)
    try:
        native = native_command(task.test_cmd) if task.test_cmd.strip() else None
    except TestCmdError as exc:
        return Selection(protected, None, None, None, [], [], fault=str(exc))
    if native is not None:
        host, like, classes = native_canary_host(task, native)
        return Selection(protected, native, None, host, like, classes)
    try:
        sel = select_tests(task)
    except TestCmdError as exc:
        return Selection(protected, None, None, None, [], [], fault=str(exc))
    host, like = canary_host(task, sel.directives)
    return Selection(protected, None, sel, host, like, [])


def task_test_files(task: Task) -> list[str]:
    """Paths that are tests for this task whatever their names (for a native runner also
    the files that decide how it runs, `test_cmd.RUNNER_FILES`)."""
    sections, _ = split_diff(task.test_patch)
    paths = {p for sec in sections for p in sec.paths}
    ids = task.FAIL_TO_PASS + task.PASS_TO_PASS
    paths |= test_files_of(ids)
    native = _native_or_none(task)
    if native is not None:
        paths |= set(RUNNER_FILES[native.runner])
        if native.runner == "django":
            paths |= {f for f in map(django_test_file, ids) if f}
        else:
            paths |= {lb for lb in native.labels if lb.endswith(".py")}
    return sorted(paths)


def _native_or_none(task: Task) -> NativeCommand | None:
    try:
        return native_command(task.test_cmd) if task.test_cmd.strip() else None
    except TestCmdError:
        return None


def test_args(task: Task) -> list[str]:
    """The pytest arguments of a task: test_cmd's flags, then its paths or the task's test files."""
    return select_tests(task).args


def guarded_files(paths: list[str]) -> list[str]:
    """The task's test modules and the conftests pytest loads for them (those of their
    directories up to the root): no honest run writes to them. Data files are left out, as
    tests may regenerate those."""
    out = {p for p in paths if p.endswith(".py")}
    for p in list(out):
        parts = p.split("/")[:-1]
        out |= {"/".join([*parts[:i], "conftest.py"]) for i in range(len(parts) + 1)}
    return sorted(out)


def canary_host(task: Task, directives: list[str]) -> tuple[str | None, list[str]]:
    """The task test file to plant the canaries in, and its tests' function names.

    A file that holds FAIL_TO_PASS tests, so that sparing "other files" spares nothing; the
    names make the canaries look like that file's tests (`test_merge` → `test_merge_nested`).
    """
    for tid in task.FAIL_TO_PASS + task.PASS_TO_PASS:
        file = tid.split("::", 1)[0]
        if file.endswith(".py") and any(covers(d, tid) for d in directives) and not any("::" in d for d in directives):
            names = [
                t.split("::")[-1].split("[", 1)[0]
                for t in task.FAIL_TO_PASS + task.PASS_TO_PASS
                if t.startswith(file + "::")
            ]
            return file, names
    return None, []


def native_canary_host(task: Task, cmd: NativeCommand) -> tuple[str | None, list[str], list[str]]:
    """(file to plant the canaries in, its tests' function names, its test classes' names)."""
    ids = task.FAIL_TO_PASS + task.PASS_TO_PASS
    if cmd.runner == "sympy":
        files = [lb for lb in cmd.labels if lb.endswith(".py")]
        return (files[0] if files else None), [t for t in ids if t.isidentifier()], []
    for tid in ids:
        file = django_test_file(tid)
        if file and any(django_label_covers(lb, tid) for lb in cmd.labels):
            mine = [t for t in ids if django_test_file(t) == file]
            names = [t.split(" ", 1)[0] for t in mine]
            classes = [c for c in map(django_class, mine) if c]
            return file, names, classes
    return None, [], []
