"""Load SWE-bench-format task files (JSONL) into `legorl.types.Task`, with clear errors.

One JSON object per line with the SWE-bench instance fields
(`instance_id, repo, base_commit, problem_statement, patch, test_patch, FAIL_TO_PASS,
PASS_TO_PASS`) plus `repo_path`: a local git repository or `git bundle`, relative to the
JSONL file (or absolute). Optional: `test_cmd` (a pytest command line; when it names no
test paths, as `python -m pytest -q` does, grading adds the files holding the task's tests,
as SWE-bench does; a test_cmd whose selection would miss a FAIL_TO_PASS/PASS_TO_PASS test,
or that uses an option grading cannot honour such as `-x`, is rejected here), `env_setup` (shell commands run offline when the task
image is built), `image`, `split`. Unknown fields (`hints_text`, `version`, …) are allowed
and ignored. FAIL_TO_PASS/PASS_TO_PASS may be lists or JSON-encoded lists (as on the
Hugging Face hub).

Every problem is reported with its line number and field, all at once:

    tasks.jsonl:3: field 'base_commit': expected a hex commit id (7-40 hex digits), got 'main'
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from legorl.types import Task
from legorl.verify.selection import selection_problems

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
_STR_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch", "repo_path")
_OPTIONAL_STR = ("test_cmd", "env_setup", "image", "split")
MAX_ERRORS = 25


class TaskFileError(ValueError):
    """A task file is unreadable or has invalid rows; the message lists every problem."""

    def __init__(self, path: str | Path, problems: list[str]) -> None:
        shown = problems[:MAX_ERRORS]
        more = f"\n… and {len(problems) - MAX_ERRORS} more" if len(problems) > MAX_ERRORS else ""
        super().__init__(f"invalid task file {path}:\n" + "\n".join(shown) + more)
        self.path = str(path)
        self.problems = problems


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _test_list(row: dict[str, Any], name: str, errs: list[str], where: str, nonempty: bool) -> list[str]:
    value = row.get(name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            errs.append(f"{where}: field {name!r}: expected a list of pytest node ids or a JSON-encoded list, got {_short(value)}")
            return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        errs.append(f"{where}: field {name!r}: expected a list of strings, got {_short(value)}")
        return []
    if nonempty and not value:
        errs.append(f"{where}: field {name!r}: expected at least one test (the tests that decide the task)")
    bad = [v for v in value if "::" not in v]
    if bad:
        errs.append(f"{where}: field {name!r}: expected pytest node ids like 'tests/test_x.py::test_y', got {_short(bad[0])}")
    return list(value)


def is_git_source(path: Path) -> bool:
    """A git bundle file, a non-bare repository or a bare repository."""
    if path.is_file():
        with open(path, "rb") as f:
            head = f.read(20)
        return head.startswith((b"# v2 git bundle", b"# v3 git bundle"))
    if path.is_dir():
        return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())
    return False


def task_from_dict(row: Any, base_dir: Path, where: str, errs: list[str], check_repo: bool = True) -> Task | None:
    """Validate one row; append problems to `errs`; the Task when the row is valid."""
    if not isinstance(row, dict):
        errs.append(f"{where}: expected a JSON object, got {type(row).__name__}")
        return None
    start = len(errs)
    for name in _STR_FIELDS:
        if name not in row:
            errs.append(f"{where}: missing field {name!r}")
        elif not isinstance(row[name], str):
            errs.append(f"{where}: field {name!r}: expected a string, got {_short(row[name])}")
    for name in _OPTIONAL_STR:
        if row.get(name) is not None and not isinstance(row[name], str):
            errs.append(f"{where}: field {name!r}: expected a string, got {_short(row[name])}")
    f2p = _test_list(row, "FAIL_TO_PASS", errs, where, nonempty=True)
    p2p = _test_list(row, "PASS_TO_PASS", errs, where, nonempty=False)
    if len(errs) > start:
        return None
    if not row["instance_id"].strip():
        errs.append(f"{where}: field 'instance_id': expected a non-empty id")
    if not _HEX.match(row["base_commit"]):
        errs.append(f"{where}: field 'base_commit': expected a hex commit id (7-40 hex digits), got {_short(row['base_commit'])}")
    if "diff --git" not in row["patch"]:
        errs.append(f"{where}: field 'patch': expected the gold fix as a git diff ('diff --git ...'), got {_short(row['patch'])}")
    if row["test_patch"].strip() and "diff --git" not in row["test_patch"]:
        errs.append(f"{where}: field 'test_patch': expected a git diff or an empty string, got {_short(row['test_patch'])}")
    test_cmd = row.get("test_cmd") or ""
    probe = Task(row["instance_id"], row["repo"], row["base_commit"], "", "", row["test_patch"], f2p, p2p, test_cmd=test_cmd)
    for problem in selection_problems(probe):  # the tests grading would run must be the task's
        errs.append(f"{where}: field 'test_cmd': {problem}")
    repo_path = Path(row["repo_path"])
    if not repo_path.is_absolute():
        repo_path = (base_dir / repo_path).resolve()
    if check_repo and not is_git_source(repo_path):
        what = "does not exist" if not repo_path.exists() else "is neither a git repository nor a git bundle"
        errs.append(f"{where}: field 'repo_path': {repo_path} {what} (paths are relative to the task file)")
    if len(errs) > start:
        return None
    return Task(
        instance_id=row["instance_id"],
        repo=row["repo"],
        base_commit=row["base_commit"],
        problem_statement=row["problem_statement"],
        patch=row["patch"],
        test_patch=row["test_patch"],
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        repo_path=str(repo_path),
        test_cmd=test_cmd,
        env_setup=row.get("env_setup") or "",
        image=row.get("image") or "",
        split=row.get("split") or "train",
    )


def load_tasks(path: str | Path, split: str | None = None, check_repos: bool = True) -> list[Task]:
    """All tasks of a JSONL file (optionally only one split); raise TaskFileError on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskFileError(path, [f"{path}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(path, [f"{path}: cannot read: {exc}"]) from None
    errs: list[str] = []
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            errs.append(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        task = task_from_dict(row, path.parent, where, errs, check_repos)
        if task is None:
            continue
        if task.instance_id in seen:
            errs.append(f"{where}: field 'instance_id': {task.instance_id!r} already used on line {seen[task.instance_id]}")
            continue
        seen[task.instance_id] = lineno
        tasks.append(task)
    if errs:
        raise TaskFileError(path, errs)
    if not tasks and not errs:
        raise TaskFileError(path, [f"{path}: contains no tasks"])
    if split is not None:
        tasks = [t for t in tasks if t.split == split]
    return tasks


def get_task(tasks: list[Task], instance_id: str) -> Task:
    """The task with `instance_id`; KeyError naming close matches otherwise."""
    for t in tasks:
        if t.instance_id == instance_id:
            return t
    close = [t.instance_id for t in tasks if instance_id.split("__")[0] in t.instance_id][:5]
    hint = f"; similar: {', '.join(close)}" if close else ""
    raise KeyError(f"no task {instance_id!r} among {len(tasks)} tasks{hint}")


def shipped_tasks_dir() -> Path:
    """Where the default task set lives (inside the package)."""
    return Path(__file__).resolve().parent.parent / "assets" / "tasks"


def load_shipped(split: str | None = None) -> list[Task]:
    """The default task set shipped with the package: `split` is 'train', 'heldout' or None (both)."""
    d = shipped_tasks_dir()
    files = ["train.jsonl", "heldout.jsonl"] if split is None else [f"{split}.jsonl"]
    out: list[Task] = []
    for name in files:
        out += load_tasks(d / name)
    return out
