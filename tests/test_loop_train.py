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
    ui = subprocess.Popen([*LEGORL, "ui", "--run", str(run_dir), "--port", str(port)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
