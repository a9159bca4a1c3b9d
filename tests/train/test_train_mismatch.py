"""Mismatch metrics (verl's definitions, as bench/mismatch.py reports them) and TIS/MIS weights, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from legorl.train.mismatch import MismatchStats, correction_weights, mismatch_metrics


def sample_pair(seed=0, n=200):
    g = torch.Generator().manual_seed(seed)
    rollout = torch.log(torch.rand(n, generator=g) * 0.98 + 0.01)
    trainer = rollout + 0.05 * torch.randn(n, generator=g)
    mask = (torch.rand(n, generator=g) > 0.2).float()
    return trainer, rollout, mask


def test_metrics_match_numpy_reference():
    trainer, rollout, mask = sample_pair()
    m = mismatch_metrics(trainer, rollout, mask)
    sel = mask.numpy() > 0
    t, r = trainer.double().numpy()[sel], rollout.double().numpy()[sel]
    pt, pr = np.exp(t), np.exp(r)
    d = t - r
    assert m["mismatch/pearson"] == pytest.approx(np.corrcoef(pr, pt)[0, 1], rel=1e-9)
    assert m["mismatch/mean_abs_dp"] == pytest.approx(np.abs(pt - pr).mean(), rel=1e-9)
    assert m["mismatch/max_abs_dp"] == pytest.approx(np.abs(pt - pr).max(), rel=1e-9)
    assert m["mismatch/mean_abs_dlogp"] == pytest.approx(np.abs(d).mean(), rel=1e-9)
    assert m["mismatch/max_abs_dlogp"] == pytest.approx(np.abs(d).max(), rel=1e-9)
    assert m["mismatch/k3_kl"] == pytest.approx((np.exp(d) - 1 - d).mean(), rel=1e-9)


def test_stats_accumulate_across_micro_batches():
    trainer, rollout, mask = sample_pair(3)
    acc = MismatchStats()
    acc.add(trainer[:70], rollout[:70], mask[:70])
    acc.add(trainer[70:], rollout[70:], mask[70:])
    whole = mismatch_metrics(trainer, rollout, mask)
    for k, v in acc.metrics().items():
        assert v == pytest.approx(whole[k], rel=1e-9), k


def test_identical_logprobs_give_perfect_agreement():
    _, rollout, mask = sample_pair(1)
    m = mismatch_metrics(rollout.clone(), rollout, mask)
    assert m["mismatch/pearson"] == pytest.approx(1.0)
    assert m["mismatch/max_abs_dp"] == 0.0 and m["mismatch/k3_kl"] == 0.0


def weights_case():
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0, -0.2], dtype=torch.float64)
    rollout = torch.tensor([-1.5, -1.0, -0.5, -1.0, -1.1, -9.0], dtype=torch.float64)
    mask = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    units = torch.tensor([0, 0, 0, 1, 1, 1])
    return old, rollout, mask, units


def test_token_tis_and_mis_by_hand():
    old, rollout, mask, units = weights_case()
    rho = [math.exp(o - r) for o, r in zip(old.tolist(), rollout.tolist(), strict=True)]
    w, stats = correction_weights(old, rollout, mask, units, 2, mode="tis", level="token", tis_cap=2.0)
    assert w.tolist()[:5] == pytest.approx([min(x, 2.0) for x in rho[:5]])
    assert w[5] == 0.0 and stats["truncated"] == 0  # ρ = e^0.5 < 2 and e^-1, e^-2 are not truncated
    w, stats = correction_weights(old, rollout, mask, units, 2, mode="mis", level="token", mis_low=0.5, mis_high=2.0)
    expected = [x if 0.5 <= x <= 2.0 else 0.0 for x in rho[:5]]
    assert w.tolist()[:5] == pytest.approx(expected)
    assert stats["rejected"] == 2  # e^-1 and e^-2


def test_sequence_and_geometric_levels_by_hand():
    old, rollout, mask, units = weights_case()
    d = (old - rollout).tolist()
    seq = [math.exp(sum(d[:3])), math.exp(sum(d[3:5]))]
    geo = [math.exp(sum(d[:3]) / 3), math.exp(sum(d[3:5]) / 2)]
    w, _ = correction_weights(old, rollout, mask, units, 2, mode="tis", level="sequence", tis_cap=5.0)
    assert w.tolist()[:5] == pytest.approx([min(seq[0], 5.0)] * 3 + [min(seq[1], 5.0)] * 2)
    w, _ = correction_weights(old, rollout, mask, units, 2, mode="mis", level="geometric", mis_low=0.5, mis_high=2.0)
    exp = [g if 0.5 <= g <= 2.0 else 0.0 for g in geo]
    assert w.tolist()[:5] == pytest.approx([exp[0]] * 3 + [exp[1]] * 2)
    assert correction_weights(old, rollout, mask, units, 2, mode="none")[0] is None
