"""Task files: clear errors (line, field, expectation), SWE-bench variants, the shipped set."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from legorl.tasks.loader import TaskFileError, get_task, load_shipped, load_tasks, shipped_tasks_dir
from legorl.verify.junit import TestStatus  # noqa: F401  (the shipped set's ids are pytest node ids)


def make_repo(path: Path) -> str:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "a.py").write_text("x = 1\n")
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", "x"], check=True, env=env)
    return subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def row(commit: str, **over: object) -> dict:
    base = {
        "instance_id": "o__r-1",
        "repo": "o/r",
        "base_commit": commit,
        "problem_statement": "fix it",
        "patch": "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n",
        "test_patch": "",
        "FAIL_TO_PASS": ["tests/test_a.py::test_x"],
        "PASS_TO_PASS": [],
        "repo_path": "repo",
    }
    base.update(over)
    return base


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_valid_file_with_relative_repo_and_json_encoded_lists(tmp_path: Path) -> None:
    commit = make_repo(tmp_path / "repo")
    f = write(
        tmp_path / "t.jsonl",
        [
            row(commit),
            row(
                commit,
                instance_id="o__r-2",
                FAIL_TO_PASS=json.dumps(["t.py::a"]),
                PASS_TO_PASS="[]",
                hints_text="ignored",
                split="heldout",
            ),
        ],
    )
    tasks = load_tasks(f)
    assert [t.instance_id for t in tasks] == ["o__r-1", "o__r-2"]
    assert tasks[0].repo_path == str((tmp_path / "repo").resolve())
    assert tasks[1].FAIL_TO_PASS == ["t.py::a"] and tasks[1].split == "heldout"
    assert [t.instance_id for t in load_tasks(f, split="train")] == ["o__r-1"]
    assert get_task(tasks, "o__r-2").instance_id == "o__r-2"
    with pytest.raises(KeyError, match="no task 'o__r-9'"):
        get_task(tasks, "o__r-9")


def test_every_problem_is_reported_with_line_and_field(tmp_path: Path) -> None:
    commit = make_repo(tmp_path / "repo")
    rows = [
        row(commit),
        "{not json",
        row(commit, instance_id="o__r-3", base_commit="main"),
        {k: v for k, v in row(commit, instance_id="o__r-4").items() if k != "patch"},
        row(commit, instance_id="o__r-5", FAIL_TO_PASS=[]),
        row(commit, instance_id="o__r-6", FAIL_TO_PASS=["test_x"]),
        row(commit, instance_id="o__r-7", repo_path="nowhere"),
        row(commit, instance_id="o__r-8", test_cmd="tox -e py311"),
        row(commit),  # duplicate id
        row(commit, instance_id="o__r-10", PASS_TO_PASS=5),
        "[1, 2]",
    ]
    with pytest.raises(TaskFileError) as info:
        load_tasks(write(tmp_path / "bad.jsonl", rows))
    msg = str(info.value)
    expected = [
        "bad.jsonl:2: not valid JSON",
        "bad.jsonl:3: field 'base_commit': expected a hex commit id",
        "bad.jsonl:4: missing field 'patch'",
        "bad.jsonl:5: field 'FAIL_TO_PASS': expected at least one test",
        "bad.jsonl:6: field 'FAIL_TO_PASS': expected pytest node ids",
        "bad.jsonl:7: field 'repo_path':",
        "bad.jsonl:8: field 'test_cmd': test runner 'tox' cannot be hardened for grading",
        "bad.jsonl:9: field 'instance_id': 'o__r-1' already used on line 1",
        "bad.jsonl:10: field 'PASS_TO_PASS': expected a list of strings, got 5",
        "bad.jsonl:11: expected a JSON object, got list",
    ]
    for e in expected:
        assert e in msg, (e, msg)
    assert len(info.value.problems) == len(expected)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="no such file"):
        load_tasks(tmp_path / "nope.jsonl")
    with pytest.raises(TaskFileError, match="contains no tasks"):
        load_tasks(write(tmp_path / "empty.jsonl", []))


def test_shipped_task_set() -> None:
    tasks = load_shipped()
    assert len(tasks) >= 60
    projects = Counter(t.repo for t in tasks)
    assert len(projects) >= 3, projects
    splits = Counter(t.split for t in tasks)
    assert splits["train"] > 0 and splits["heldout"] > 0
    assert {t.split for t in load_shipped("heldout")} == {"heldout"}
    ids = [t.instance_id for t in tasks]
    assert len(set(ids)) == len(ids)
    total = sum(p.stat().st_size for p in shipped_tasks_dir().rglob("*") if p.is_file())
    assert total < 8 * 1024 * 1024, f"shipped task data is {total} bytes"
    for t in tasks:
        assert t.repo_path.endswith(".bundle") and Path(t.repo_path).is_file()
        assert t.test_cmd.startswith("pytest")
        # The problem statement names failing tests but never the fix.
        assert any(tid in t.problem_statement for tid in t.FAIL_TO_PASS)
        assert t.patch not in t.problem_statement
