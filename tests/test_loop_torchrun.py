"""`legorl train` under torchrun (2 CPU ranks, gloo, FSDP2): rank 0 rolls out and records,
both ranks train on the broadcast trajectories, and the run ends cleanly on both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from legorl.monitor.store import RunStore
from legorl.tasks.loader import load_shipped
from test_loop_train import AGENT


@pytest.mark.slow
def test_train_under_torchrun_two_ranks(tmp_path: Path) -> None:
    task = load_shipped("train")[0]
    (tmp_path / "agent.sh").write_text(AGENT.replace("__PATCH__", task.patch.rstrip("\n") + "\n"))
    (tmp_path / "run.toml").write_text("""
[run]
dir = "run"
steps = 2
tasks_per_step = 1
group_size = 2
[proxy]
max_tokens = 8
[sandbox]
agent_timeout_s = 180
[harness]
name = "command"
command_file = "agent.sh"
[trainer]
lr = 1e-4
zero_variance_groups = "keep"
""")
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "legorl.cli", "train",
                           str(tmp_path / "run.toml")], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    with RunStore(tmp_path / "run", readonly=True) as store:
        history = store.metrics_history()
    assert [h["step"] for h in history] == [0, 1]
    assert all("train/loss" in h and h["train/tokens_per_s"] > 0 for h in history)
