"""One line for each foreseeable mistake around a run (issue 39, item 6), through the CLI:
a `run.dir` that is a file, a corrupt `run.sqlite` (in `train`, `--resume`, `export` and
`ui` alike), a model directory with a config.json but no weights, a task whose
`base_commit` its repository does not hold. Each used to end in a traceback of 60 to 160
lines (or, for the commit, in every rollout of the task masked as `infra_error`)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from legorl.models import resolve_model
from legorl.store.run_store import RunStore
from legorl.tasks.loader import TaskFileError, load_tasks, shipped_tasks_dir

LEGORL = [sys.executable, "-m", "legorl.cli"]


def config(tmp_path: Path, *, run_dir: Path | None = None, tasks: str = "quickstart-calc", model: str = "") -> Path:
    path = tmp_path / "run.toml"
    trainer = model or "quickstart-qwen3"
    path.write_text(f"""
[run]
dir = "{run_dir or tmp_path / "run"}"
tasks = "{tasks}"
steps = 1
tasks_per_step = 1
group_size = 2
[calc_tasks]
train = 8
heldout = 4
[engine]
kind = "hf"
model = "quickstart-qwen3"
[harness]
name = "command"
command_file = "{tmp_path / "agent.sh"}"
[trainer]
model = "{trainer}"
""")
    (tmp_path / "agent.sh").write_text("true\n")
    return path


def legorl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEGORL, *args], capture_output=True, text=True, timeout=timeout, check=False)


def one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_a_run_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("notes")
    one_line(legorl("train", str(config(tmp_path))), "run.dir", "is a file, not a directory")
    assert (tmp_path / "run").read_text() == "notes"


@pytest.fixture
def corrupt_run(tmp_path: Path) -> Path:
    """A run directory whose store was cut in half (a full disk, a bad copy)."""
    run_dir = tmp_path / "run"
    with RunStore(run_dir, run_name="run") as store:
        for step in range(200):
            store.log_metrics(step, {f"m/{i}": float(i) for i in range(8)})
        store.add_event("note", {"text": "x" * 20000})
    db = run_dir / "run.sqlite"
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    return run_dir


def test_a_corrupt_store_is_one_line_in_train_resume_export_and_ui(corrupt_run: Path, tmp_path: Path) -> None:
    cfg = str(config(tmp_path, run_dir=corrupt_run))
    what = ("cannot read the run store", "run.sqlite: it is corrupt", "Restore it from a copy", "--overwrite")
    one_line(legorl("train", cfg), *what)  # it used to be "a run with 1 records": `--resume` it
    one_line(legorl("train", cfg, "--resume"), *what)
    one_line(legorl("export", str(corrupt_run), "--out", str(tmp_path / "out.jsonl")), *what)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ui = subprocess.run(
        [*LEGORL, "ui", "--run", str(corrupt_run), "--port", str(port), "--insecure"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    one_line(ui, *what)  # it used to serve, and answer 500 to every call


def test_a_model_directory_without_weights(tmp_path: Path) -> None:
    half = tmp_path / "half-copied"
    half.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(resolve_model("quickstart-qwen3") / name, half / name)
    proc = legorl("train", str(config(tmp_path, model=str(half))))
    one_line(proc, f"trainer.model: {half} has a config.json but no weights", "*.safetensors")
    assert not (tmp_path / "run" / "run.sqlite").exists()


def test_a_base_commit_missing_from_its_repository(tmp_path: Path) -> None:
    """Refused when the tasks load (it used to mask every rollout of the task), naming the row."""
    shipped = shipped_tasks_dir()
    row = json.loads((shipped / "train.jsonl").read_text().splitlines()[0])
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str((shipped / row["repo_path"]).resolve()), str(repo)], check=True)
    bad = {**row, "instance_id": "missing-commit-1", "base_commit": "0123456789abcdef0123456789abcdef01234567"}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({**r, "repo_path": str(repo)}) for r in (row, bad)) + "\n")
    with pytest.raises(TaskFileError, match=r"tasks.jsonl:2: field 'base_commit': 0123456789ab\w* is not a commit"):
        load_tasks(tasks)
    skipped: list[str] = []
    assert [t.instance_id for t in load_tasks(tasks, skipped=skipped)] == [row["instance_id"]]
    assert len(skipped) == 1 and "is not a commit of" in skipped[0], skipped
    proc = legorl("train", str(config(tmp_path, tasks=str(tasks))))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "tasks.jsonl:2: field 'base_commit'" in proc.stderr and "is not a commit of" in proc.stderr, proc.stderr
