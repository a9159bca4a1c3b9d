"""`legorl train` for 2 steps with a real harness (mini-swe-agent, unmodified, in local
sandboxes) driven by the tiny hf model: every rollout is recorded, graded as an agent
outcome (never infra_error), trained on, and served by the UI's store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from legorl.store.run_store import RunStore


@pytest.mark.slow
@pytest.mark.harness
def test_train_two_steps_with_mini_swe_agent(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text("""
[run]
dir = "run"
steps = 2
tasks_per_step = 1
group_size = 2
[engine]
kind = "hf"
model = "tiny-qwen3"
[proxy]
max_tokens = 24
[sandbox]
agent_timeout_s = 240
[harness]
name = "mini-swe-agent"
max_turns = 2
[trainer]
lr = 1e-4
zero_variance_groups = "keep"
""")
    proc = subprocess.run(
        [sys.executable, "-m", "legorl.cli", "train", str(tmp_path / "run.toml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with RunStore(tmp_path / "run", readonly=True) as store:
        listing = store.list_trajectories(limit=50)
        history = store.metrics_history()
        assert listing["total"] == 4
        for item in listing["items"]:
            traj = store.get_trajectory(item["session_id"])
            assert traj["turns"], "no turn recorded"
            assert item["status"] not in ("infra_error", "engine_error", "sandbox_start_failed"), item
    assert [h["step"] for h in history] == [0, 1] and all("train/loss" in h for h in history)
