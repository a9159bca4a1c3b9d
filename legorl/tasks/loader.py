"""Load SWE-bench-format task files (JSONL) into `legorl.types.Task`, with clear errors.

A directory instead of a file is a Harbor task directory or a directory of them
(`harbor.py`); rows of the SWE-bench family (SWE-smith, SWE-Gym, R2E-Gym, SWE-rebench) are
mapped to these fields first (`family.py`).

One JSON object per line with the SWE-bench instance fields
(`instance_id, repo, base_commit, problem_statement, patch, test_patch, FAIL_TO_PASS,
PASS_TO_PASS`) plus `repo_path`: a local git repository or `git bundle`, relative to the
JSONL file (or absolute). Optional: `test_cmd` (a pytest command line; when it names no
test paths, as `python -m pytest -q` does, grading adds the files holding the task's tests,
as SWE-bench does; a test_cmd whose selection would miss a FAIL_TO_PASS/PASS_TO_PASS test,
or that uses an option grading cannot honour such as `-x`, is rejected here), `env_setup` (shell commands run offline
when the task
image is built), `image`, `split`. Unknown fields (`hints_text`, `version`, …) are allowed
and ignored. FAIL_TO_PASS/PASS_TO_PASS may be lists or JSON-encoded lists (as on the
Hugging Face hub).

Every problem is reported with its line number and field, all at once:

    tasks.jsonl:3: field 'base_commit': expected a hex commit id (7-40 hex digits), got 'main'
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Any

from legorl.tasks.family import normalise
from legorl.types import Task
from legorl.verify.selection import selection_problems
from legorl.verify.test_command import TestCmdError, django_label_covers, native_command

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
_STR_FIELDS = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
_OPTIONAL_STR = ("test_cmd", "env_setup", "image", "split", "repo_path", "version", "log_parser", "eval_script")
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


def _test_list(
    row: dict[str, Any], name: str, errs: list[str], where: str, nonempty: bool, pytest_ids: bool = True
) -> list[str]:
    value = row.get(name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            errs.append(
                (
                    f"{where}: field {name!r}: expected a list of pytest node ids or a JSON-encoded list, got "
                    f"{_short(value)}"
                )
            )
            return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        errs.append(f"{where}: field {name!r}: expected a list of strings, got {_short(value)}")
        return []
    if nonempty and not value:
        errs.append(f"{where}: field {name!r}: expected at least one test (the tests that decide the task)")
    bad = [v for v in value if "::" not in v] if pytest_ids else []
    if bad:
        errs.append(
            f"{where}: field {name!r}: expected pytest node ids like 'tests/test_x.py::test_y', got {_short(bad[0])}"
        )
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


def _test_command(row: dict[str, Any], where: str, errs: list[str]) -> str:
    """Our own `test_cmd`, else the test command of the official instance's `eval_script`."""
    if (row.get("test_cmd") or "").strip():
        return row["test_cmd"]
    if (row.get("eval_script") or "").strip():
        from legorl.tasks import official

        cmd = official.eval_test_cmd(row["eval_script"])
        if cmd is None:
            errs.append(
                f"{where}: field 'eval_script': no test command between {official.START!r} and {official.END!r}"
            )
        return cmd or ""
    return ""


def _repo_source(row: dict[str, Any], base_dir: Path, repos_dir: Path | None) -> Path | None:
    """`repo_path` (relative to the task file), else `<repos_dir>/<owner>__<name>[.bundle]`."""
    if (row.get("repo_path") or "").strip():
        p = Path(row["repo_path"])
        return p if p.is_absolute() else (base_dir / p).resolve()
    if repos_dir is not None:
        stem = row["repo"].replace("/", "__")
        for cand in (repos_dir / stem, repos_dir / f"{stem}.bundle", repos_dir / row["repo"]):
            if cand.exists():
                return cand.resolve()
        return (repos_dir / stem).resolve()
    return None


def task_from_dict(
    row: Any, base_dir: Path, where: str, errs: list[str], check_repo: bool = True, repos_dir: Path | None = None
) -> Task | None:
    """Validate one row; append problems to `errs`; the Task when the row is valid.

    The official instance format loads as it is; the repository comes from `repo_path`,
    from `repos_dir` (a directory of clones or bundles named `owner__name`), or is inside
    the prebuilt `image` the row names."""
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
    reqs = row.get("requirements") or []
    if not isinstance(reqs, list) or not all(isinstance(r, str) for r in reqs):
        errs.append(f"{where}: field 'requirements': expected a list of requirement strings, got {_short(reqs)}")
    if len(errs) > start:
        return None
    test_cmd = _test_command(row, where, errs)
    try:
        native = native_command(test_cmd) if test_cmd.strip() else None
    except TestCmdError as exc:
        errs.append(f"{where}: field 'test_cmd': {exc}")
        return None
    if not test_cmd.strip() and row.get("version") and not row.get("repo_path"):
        from legorl.tasks import official

        errs.append(
            f"{where}: no test command for {row['repo']} version {row['version']}: the row has neither 'test_cmd' nor "
            f"'eval_script', and swebench {official.PINNED} keeps no per-version specs (add one of the two)"
        )
        return None
    f2p = _test_list(row, "FAIL_TO_PASS", errs, where, nonempty=True, pytest_ids=native is None)
    p2p = _test_list(row, "PASS_TO_PASS", errs, where, nonempty=False, pytest_ids=native is None)
    if len(errs) > start:
        return None
    log_parser = row.get("log_parser") or ""
    if native is not None:
        from legorl.tasks import official

        try:
            parser = official.parser_name(row["repo"], log_parser)
        except official.OfficialUnavailable as exc:
            errs.append(f"{where}: {exc}")
            return None
        if parser is None:
            errs.append(
                f"{where}: no official log parser for repository {row['repo']!r} (log_parser {log_parser!r}); "
                "the runner's log cannot be read"
            )
            return None
        log_parser = parser
        if native.runner == "django":
            lost = [t for t in f2p + p2p if not any(django_label_covers(lb, t) for lb in native.labels)]
            if lost:
                errs.append(
                    (
                        f"{where}: field 'test_cmd': {len(lost)} FAIL_TO_PASS/PASS_TO_PASS tests are not selected by "
                        f"its labels {native.labels}: {lost[:3]}"
                    )
                )
        elif not any(lb.endswith(".py") for lb in native.labels):
            errs.append(f"{where}: field 'test_cmd': bin/test must name the task's test files (got {native.labels})")
    if not row["instance_id"].strip():
        errs.append(f"{where}: field 'instance_id': expected a non-empty id")
    if not _HEX.match(row["base_commit"]):
        errs.append(
            (
                f"{where}: field 'base_commit': expected a hex commit id (7-40 hex digits), got "
                f"{_short(row['base_commit'])}"
            )
        )
    if "diff --git" not in row["patch"]:
        errs.append(
            (
                f"{where}: field 'patch': expected the gold fix as a git diff ('diff --git ...'), got "
                f"{_short(row['patch'])}"
            )
        )
    if row["test_patch"].strip() and "diff --git" not in row["test_patch"]:
        errs.append(
            f"{where}: field 'test_patch': expected a git diff or an empty string, got {_short(row['test_patch'])}"
        )
    probe = Task(
        row["instance_id"], row["repo"], row["base_commit"], "", "", row["test_patch"], f2p, p2p, test_cmd=test_cmd
    )
    if native is None:
        for problem in selection_problems(probe):  # the tests grading would run must be the task's
            errs.append(f"{where}: field 'test_cmd': {problem}")
    repo_path = _repo_source(row, base_dir, repos_dir)
    if repo_path is None and not row.get("image"):
        errs.append(f"{where}: missing field 'repo_path' (or pass a repos directory, or name a prebuilt 'image')")
    elif repo_path is not None and check_repo and not is_git_source(repo_path):
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
        repo_path=str(repo_path) if repo_path is not None else "",
        test_cmd=test_cmd,
        env_setup=row.get("env_setup") or "",
        image=row.get("image") or "",
        split=row.get("split") or "train",
        version=str(row.get("version") or ""),
        log_parser=log_parser,
        requirements=list(reqs),
    )


def load_tasks(
    path: str | Path,
    split: str | None = None,
    check_repos: bool = True,
    repos_dir: str | Path | None = None,
    skipped: list[str] | None = None,
) -> list[Task]:
    """All tasks of a JSONL file (optionally only one split); raise TaskFileError on any problem.

    With `skipped` (a list), invalid rows are left out and their problems appended to it,
    one line each, so the rest of a large official set loads. `repos_dir`: where rows
    without `repo_path` find their repository (`owner__name`, a clone or a bundle)."""
    path = Path(path)
    if path.is_dir():  # a Harbor task directory, or a directory of them (harbor.py)
        return _load_harbor(path, split, skipped)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskFileError(path, [f"{path}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(path, [f"{path}: cannot read: {exc}"]) from None
    errs: list[str] = []
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    notes: dict[str, list[str]] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            errs.append(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        n_errs = len(errs)
        if isinstance(row, dict):  # SWE-smith / R2E-Gym / SWE-rebench rows in our fields (family.py)
            row, row_notes = normalise(row, where)
            for note in row_notes:
                _note_once(notes, note)
        task = task_from_dict(row, path.parent, where, errs, check_repos, Path(repos_dir) if repos_dir else None)
        if task is None:
            if skipped is not None:
                skipped.extend(errs[n_errs:])
                del errs[n_errs:]
            continue
        if task.instance_id in seen:
            errs.append(
                f"{where}: field 'instance_id': {task.instance_id!r} already used on line {seen[task.instance_id]}"
            )
            continue
        seen[task.instance_id] = lineno
        tasks.append(task)
    if check_repos:  # a base_commit the repository lacks would mask every rollout of its task
        bad = _missing_base_commits(tasks, path, seen)
        if skipped is not None:
            skipped.extend(bad.values())
        else:
            errs.extend(bad.values())
        tasks = [t for t in tasks if t.instance_id not in bad]
    for first in notes.values():  # each field we cannot honour, said once (with how many rows)
        more = f" (and {len(first) - 1} more rows)" if len(first) > 1 else ""
        logging.getLogger(__name__).warning("%s%s", first[0], more)
    if errs:
        raise TaskFileError(path, errs)
    if not tasks and not errs:
        raise TaskFileError(path, [f"{path}: contains no tasks"] + (skipped or []))
    if split is not None:
        tasks = [t for t in tasks if t.split == split]
    return tasks


def _missing_base_commits(tasks: list[Task], path: Path, lines: dict[str, int]) -> dict[str, str]:
    """instance_id → the problem, for each task whose `base_commit` is not a commit of its
    repository (a git directory; a bundle is only unpacked when an image is built, and its
    rollouts then say what is wrong). One `git cat-file --batch-check` per repository."""
    by_repo: dict[str, list[Task]] = {}
    for t in tasks:
        if t.repo_path and Path(t.repo_path).is_dir():
            by_repo.setdefault(t.repo_path, []).append(t)
    bad: dict[str, str] = {}
    for repo, group in by_repo.items():
        try:
            proc = subprocess.run(
                ["git", "-C", repo, "cat-file", "--batch-check"],
                input="".join(f"{t.base_commit}^{{commit}}\n" for t in group),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue  # no git here, or a hung one: not ours to judge at load
        answers = proc.stdout.splitlines()
        if proc.returncode != 0 or len(answers) != len(group):
            continue
        for t, answer in zip(group, answers, strict=True):
            if answer.endswith((" missing", " ambiguous")):
                bad[t.instance_id] = (
                    f"{path.name}:{lines.get(t.instance_id, 0)}: field 'base_commit': {t.base_commit} is not a "
                    f"commit of {repo} (another repository, or a shallow or outdated clone? fetch it)"
                )
    return bad


def _note_once(notes: dict[str, list[str]], note: str) -> None:
    key = re.sub(r"(branch|commit) '[^']*'", r"\1 _", note.split(": ", 1)[-1])
    notes.setdefault(key, []).append(note)


def _load_harbor(path: Path, split: str | None, skipped: list[str] | None) -> list[Task]:
    from legorl.tasks.harbor import load_harbor

    errs: list[str] = []
    notes: list[str] = []
    tasks = load_harbor(path, errs, notes)
    for note in notes:  # settings of a task we cannot honour: said, never silently dropped
        logging.getLogger(__name__).warning("%s", note)
    if errs and skipped is not None:
        skipped.extend(errs)
    elif errs:
        raise TaskFileError(path, errs)
    if not tasks:
        raise TaskFileError(path, [f"{path}: contains no tasks"] + (skipped or []))
    return [t for t in tasks if t.split == split] if split is not None else tasks


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
