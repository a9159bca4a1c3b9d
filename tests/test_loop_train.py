"""End to end: `legorl train` for 2 steps (tiny hf model, command harness, local sandboxes),
then `legorl ui` serves the run directory with its trajectories, outcomes and metrics."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from loop_util import LEGORL, train, write_run

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_train_two_steps_then_ui(tmp_path: Path) -> None:
    proc = train(write_run(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert (run_dir / "run.sqlite").exists()
    assert list((run_dir / "checkpoints").iterdir()), "no checkpoint written"

    port = _free_port()
    ui = subprocess.Popen(
        [*LEGORL, "ui", "--run", str(run_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(base + "/api/run", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        listing = httpx.get(base + "/api/trajectories", params={"limit": 50}, timeout=10).json()
        assert listing["total"] == 8
        statuses = {item["status"] for item in listing["items"]}
        assert statuses <= {"resolved", "failed", "no_patch"}, statuses
        one = httpx.get(base + f"/api/trajectories/{listing['items'][0]['session_id']}", timeout=10).json()
        assert len(one["turns"]) == 2 and one["outcome"]["status"] in statuses
        metrics = httpx.get(base + "/api/metrics", timeout=10).json()
        text = json.dumps(metrics)
        for key in ("train/loss", "reward/mean", "resolved_rate", "rollout/turns_mean", "mismatch/pearson"):
            assert key in text, key
    finally:
        ui.terminate()
        ui.wait(10)


@pytest.mark.slow
def test_asynchronous_steps_overlap_rollouts_with_training(tmp_path: Path) -> None:
    """`[run] max_staleness = 1`: each next step's rollouts run while the trainer trains;
    every turn says which policy sampled it; nothing is older than allowed; every rollout
    is stored; staleness, drops and trainer idle time are metrics."""
    config = write_run(tmp_path)
    text = config.read_text().replace("[run]\n", "[run]\nmax_staleness = 1\n", 1).replace("steps = 2", "steps = 3", 1)
    config.write_text(text.replace("[trainer]\n", '[trainer]\ncorrection = "tis"\n', 1))
    proc = train(config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import sqlite3

    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as db:
        spans = {s: (a, b) for s, a, b in db.execute("SELECT step, t_start, t_end FROM steps")}
        metrics = {(s, k): v for s, k, v in db.execute("SELECT step, key, value FROM metrics")}
        n = db.execute("SELECT count(*) FROM trajectories WHERE status IS NOT NULL").fetchone()[0]
        versions = {v for (v,) in db.execute("SELECT DISTINCT policy_version FROM turns")}
    assert sorted(spans) == [0, 1, 2] and n == 3 * 4
    assert all(spans[s + 1][0] < spans[s][1] for s in (0, 1)), spans  # s+1 began before s was trained
    assert all(metrics[s, "async/staleness_max"] <= 1 and metrics[s, "async/dropped_stale"] == 0 for s in range(3))
    assert all((s, "async/trainer_idle_s") in metrics for s in range(3))
    assert versions <= {0, 1, 2} and len(versions) >= 2  # later steps sampled by newer policies
