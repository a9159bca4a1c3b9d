"""`legorl tasks validate` (the oracle check) and `legorl rollout` with the command harness,
through their real command lines and real sandboxes: the shipped set is valid on both backends."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from legorl.tasks.loader import load_shipped, shipped_tasks_dir
from tests.helpers.tasks_util import pick_task, require_backend

CLI = [sys.executable, "-m", "legorl.tasks.cli"]
LEGORL = [sys.executable, "-m", "legorl.cli"]


def cli(*args: str, timeout: float = 3000) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def one_per_project() -> list[str]:
    by: dict[str, list[str]] = defaultdict(list)
    for t in load_shipped():
        by[t.repo].append(t.instance_id)
    return [sorted(ids)[0] for _, ids in sorted(by.items())]


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_shipped_set_is_valid_on_local(split: str) -> None:
    proc = cli("validate", shipped_tasks_dir() / f"{split}.jsonl", "--sandbox", "local", "--json")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    bad = [r for r in rows if not r["ok"]]
    assert proc.returncode == 0 and not bad, (bad, proc.stderr[-2000:])
    assert len(rows) == len(load_shipped(split))
    assert all(r["gold"] == "resolved" and r["empty"] == "failed" for r in rows)


@pytest.mark.docker
def test_shipped_subset_is_valid_on_docker() -> None:
    require_backend("docker")
    ids = one_per_project()
    args: list[str] = []
    for i in ids:
        args += ["--instance", i]
    rows = []
    for split in ("train", "heldout"):
        mine = [i for i in ids if any(t.instance_id == i for t in load_shipped(split))]
        if not mine:
            continue
        sel = [a for i in mine for a in ("--instance", i)]
        proc = cli("validate", shipped_tasks_dir() / f"{split}.jsonl", "--sandbox", "docker", "--json", *sel)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
        rows += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["instance_id"] for r in rows) == sorted(ids) and all(r["ok"] for r in rows)


def test_validate_reports_a_broken_task(tmp_path: Path) -> None:
    task = pick_task()
    readme_fix = (
        "diff --git a/NOTES.md b/NOTES.md\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 "
        "@@\n+not a fix\n"
    )
    row = dataclasses.asdict(dataclasses.replace(task, patch=readme_fix))
    f = tmp_path / "broken.jsonl"
    f.write_text(json.dumps(row) + "\n")
    proc = cli("validate", f, "--sandbox", "local")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAIL {task.instance_id}" in proc.stdout and "gold patch: failed" in proc.stdout


def test_cli_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": 3}\n')
    for args, needle in [
        (("validate", tmp_path / "missing.jsonl"), "no such file"),
        (("validate", bad), "bad.jsonl:1: field 'instance_id': expected a string"),
        (
            ("validate", shipped_tasks_dir() / "train.jsonl", "--sandbox", "podman"),
            "--sandbox must be 'local' or 'docker'",
        ),
        (("validate", shipped_tasks_dir() / "train.jsonl", "--instance", "nope"), "no task 'nope'"),
    ]:
        proc = cli(*args, timeout=120)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert needle in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_legorl_rollout_with_a_command_file_prints_one_json_line(tmp_path: Path) -> None:
    task = pick_task()
    script = tmp_path / "fix.sh"
    script.write_text(f"git apply <<'EOF'\n{task.patch}EOF\n")
    tasks = shipped_tasks_dir() / f"{task.split}.jsonl"
    args = ["rollout", "--tasks", tasks, "--instance", task.instance_id, "--command-file", script]
    proc = subprocess.run([*LEGORL, *map(str, args)], capture_output=True, text=True, timeout=600)
    out = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(out) == 1, proc.stderr[-2000:]
    line = json.loads(out[0])
    for key in ("instance_id", "status", "reward", "masked", "flags", "tests"):
        assert key in line
    assert line["instance_id"] == task.instance_id and line["status"] == "resolved" and line["reward"] == 1.0
    assert line["masked"] is False and line["flags"] == []


@pytest.mark.parametrize(
    "backend_name", [pytest.param("local", id="local"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]
)
async def test_shipped_subset_is_valid_with_a_test_cmd_that_names_no_paths(backend_name: str) -> None:
    """SWE-bench's common shape: only the runner and its flags (`python -m pytest -o addopts=`).
    The task's test files are selected all the same: gold resolves, empty does not."""
    import shlex

    from legorl.tasks.validate import check_tasks
    from legorl.verify.selection import select_tests
    from tests.helpers.tasks_util import backend_and_images

    ids = set(one_per_project())
    tasks = [
        dataclasses.replace(t, test_cmd=shlex.join(["python", "-m", "pytest", *select_tests(t).flags]))
        for t in load_shipped()
        if t.instance_id in ids
    ]
    async with backend_and_images(backend_name) as (backend, images):
        res = await check_tasks(tasks, backend, images, concurrency=2)
    assert len(res) == len(ids) and all(r.ok for r in res), [r.to_json() for r in res if not r.ok]
