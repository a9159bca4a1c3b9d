"""bench/receptive_trim.py: both arms see the same step, and the trimmed one computes less."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.receptive_trim import row
from tests.helpers.windowed_batches import harness_shaped, windowed_qwen3

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def test_a_row_times_both_arms_and_finds_them_equal() -> None:
    policy = windowed_qwen3(["sliding_attention"] * 2)
    trajs = harness_shaped(torch.Generator().manual_seed(4), int(policy.lm.config.vocab_size))
    out = row(policy, "gspo", [(i, t, (-1.0) ** i) for i, t in enumerate(trajs)], "shared_prefix", rounds=2)
    for kind in ("packed", "computed"):
        assert out["tokens"]["trimmed"][kind] < out["tokens"]["whole"][kind]
    assert out["tokens"]["whole"]["computed"] < out["tokens"]["whole"]["packed"]  # the tree shares
    assert out["max_abs_logprob_diff"] < 1e-5 and out["max_grad_diff_rel"] < 1e-5
    assert set(out["seconds"]) == {"whole", "trimmed"} and out["speedup"] > 0


def test_a_directory_without_a_run_store_is_one_line(tmp_path: Path) -> None:
    bench = Path(__file__).resolve().parents[2] / "bench" / "receptive_trim.py"
    proc = subprocess.run([sys.executable, str(bench), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"receptive_trim: no run.sqlite in {tmp_path}"
