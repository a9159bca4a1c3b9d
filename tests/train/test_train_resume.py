"""Exact resume: a training process SIGKILLed mid-step resumes from its last checkpoint and
produces bit-identical next steps (loss and every parameter) to a run never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from legorl.train.config import TrainerConfig
from legorl.train.trainer import Trainer


def minimal_cmd(steps: int, out: Path, ckpt: Path | None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "legorl.train.minimal",
        "--steps",
        str(steps),
        "--threads",
        "1",
        "--lr",
        "1e-2",
        "--new-tokens",
        "6",
        "--json",
        str(out),
    ]
    if ckpt is not None:
        cmd += ["--checkpoint-dir", str(ckpt)]
    return cmd


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_sigkill_mid_step_then_resume_is_bitwise_identical(tmp_path):
    env = dict(os.environ, PYTHONHASHSEED="0")
    ref_out = tmp_path / "uninterrupted.jsonl"
    subprocess.run(minimal_cmd(4, ref_out, None), check=True, env=env, timeout=300, capture_output=True)
    reference = rows(ref_out)
    assert [r["step"] for r in reference] == [1, 2, 3, 4]

    out, ckpt = tmp_path / "killed.jsonl", tmp_path / "ckpt"
    proc = subprocess.Popen(
        minimal_cmd(4, out, ckpt),
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        for line in proc.stderr:  # the loop announces each step before sampling it
            if line.startswith("step 2 start") or time.monotonic() > deadline:
                break
        os.killpg(proc.pid, signal.SIGKILL)  # inside step 3: sampling has begun, no update yet
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert len(rows(out)) == 2, "the kill must land before step 3 completes"
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == ["step_00000001", "step_00000002"]

    subprocess.run(minimal_cmd(4, out, ckpt), check=True, env=env, timeout=300, capture_output=True)
    resumed = rows(out)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for ref, got in zip(reference, resumed, strict=True):
        assert got["loss"] == ref["loss"]  # exact float equality
        assert got["params"] == ref["params"]  # sha256 of every parameter's bytes
        assert got["reward"] == ref["reward"]


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-qwen3-moe"])
def test_checkpoint_round_trip_restores_optimizer_scheduler_and_counters(tmp_path, model):
    """MoE included: save_pretrained re-lays-out fused experts; loading must undo it exactly."""
    cfg = TrainerConfig(model=model, lr=1e-2, warmup_steps=3, schedule="cosine", total_steps=10)
    a = Trainer(cfg)
    for p in a.policy.parameters():  # give AdamW some state
        p.grad = torch.ones_like(p)
    a.optimizer.step()
    a.scheduler.step()
    a.step_count, a.version, a.data_state = 7, 5, {"position": 42}
    path = a.save_checkpoint(tmp_path)
    b = Trainer(cfg)
    b.load_checkpoint(tmp_path)
    assert (b.step_count, b.version, b.data_state) == (7, 5, {"position": 42})
    assert b.scheduler.get_last_lr() == a.scheduler.get_last_lr()
    for pa, pb in zip(a.policy.parameters(), b.policy.parameters(), strict=True):
        assert torch.equal(pa, pb)
        sa, sb = a.optimizer.state[pa], b.optimizer.state[pb]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert path.name == "step_00000007"
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        b.load_checkpoint(tmp_path / "nothing-here")
