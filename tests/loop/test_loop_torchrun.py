"""`legorl train` under torchrun (2 CPU ranks, gloo, FSDP2): rank 0 rolls out and records,
both ranks train on the broadcast trajectories, and the run ends cleanly on both."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from legorl.store.run_store import RunStore
from tests.helpers.loop_util import train, write_run


@pytest.mark.slow
def test_train_under_torchrun_two_ranks(tmp_path: Path) -> None:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    proc = train(
        write_run(tmp_path, group_size=2, max_tokens=8),
        launcher=[torchrun, "--standalone", "--nproc_per_node", "2", "-m", "legorl.cli"],
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    with RunStore(tmp_path / "run", readonly=True) as store:
        history = store.metrics_history()
    assert [h["step"] for h in history] == [0, 1]
    assert all("train/loss" in h and h["train/tokens_per_s"] > 0 for h in history)
