"""Each loss against an independent float64 hand computation (loops over units and tokens)."""

from __future__ import annotations

import math

import pytest
import torch

from legorl.train.losses import LOSSES, Normalizer, aggregate

AGGS = ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "token_sum_norm"]


def make_batch(seed: int, clip: float):
    """6 units of varied length; unit deltas chosen to sit below, inside and above the clip band,
    with positive and negative advantages; unit 5 has no sampled token."""
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 7, 3, 6, 4, 3]
    unit_ids = torch.cat([torch.full((n,), u) for u, n in enumerate(lengths)])
    n = len(unit_ids)
    mask = (torch.rand(n, generator=g) > 0.25).double()
    mask[unit_ids == 5] = 0.0
    for u in range(5):  # every live unit keeps at least one sampled token
        mask[(unit_ids == u).nonzero()[0]] = 1.0
    old = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    shift = torch.tensor([-3.0, -0.3, 0.2, 2.5, 4.0, 0.0], dtype=torch.float64) * clip
    noise = (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * clip * 0.5
    new = old + shift[unit_ids] + noise
    adv_unit = torch.tensor([-1.3, -0.7, 0.9, -1.1, 0.4, 2.0], dtype=torch.float64)
    adv = adv_unit[unit_ids] + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    weights = torch.rand(n, generator=g, dtype=torch.float64) * 2
    return new, old, adv, mask, unit_ids, weights


def units_of(unit_ids, mask):
    out = {}
    for t, u in enumerate(unit_ids.tolist()):
        out.setdefault(u, [])
        if mask[t] > 0:
            out[u].append(t)
    return out


def ref_aggregate(per_token: dict[int, float], units: dict[int, list[int]], agg: str, norm: Normalizer):
    """per_token: token index -> loss (only sampled tokens)."""
    if agg == "token_mean":
        return sum(per_token.values()) / norm.tokens
    if agg == "token_sum_norm":
        return sum(per_token.values()) / (norm.units * norm.norm_tokens)
    total = 0.0
    for toks in units.values():
        if not toks:
            continue
        s = sum(per_token[t] for t in toks)
        total += s / len(toks) if agg == "seq_mean_token_mean" else s
    return total / norm.units


def ref_loss(name, new, old, adv, mask, unit_ids, weights, lo, hi, agg, norm):
    units = units_of(unit_ids, mask)
    per_token = {}
    clipped = 0
    ratios = []
    for toks in units.values():
        if not toks:
            continue
        s = torch.exp(sum(new[t] - old[t] for t in toks) / len(toks))
        ratios.append(float(s.detach()))
        a_u = sum(adv[t] for t in toks) / len(toks)
        w_u = sum(weights[t] for t in toks) / len(toks) if weights is not None else 1.0
        for t in toks:
            if name == "gspo":
                r, a, w = s, a_u, w_u
            elif name == "gspo_token":
                r = s.detach() * torch.exp(new[t] - new[t].detach())  # sg[s_u] · π/sg[π]
                a, w = adv[t], (weights[t] if weights is not None else 1.0)
            else:
                r = torch.exp(new[t] - old[t])
                a, w = adv[t], (weights[t] if weights is not None else 1.0)
            unclipped = r * a
            clipped_term = min(max(r, torch.tensor(1 - lo, dtype=r.dtype)), torch.tensor(1 + hi, dtype=r.dtype)) * a
            per_token[t] = -w * torch.minimum(unclipped, clipped_term)
            clipped += bool(clipped_term < unclipped)
    return ref_aggregate(per_token, units, agg, norm), clipped / sum(len(v) for v in units.values()), ratios


def normalizer(mask, unit_ids):
    units = units_of(unit_ids, mask)
    return Normalizer(tokens=float(mask.sum()), units=float(sum(1 for v in units.values() if v)), norm_tokens=16.0)


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("use_weights", [False, True])
def test_loss_matches_float64_hand_computation(name, agg, use_weights):
    clip = 3e-4 if name.startswith("gspo") else 0.2
    lo, hi = clip, clip * 4 / 3
    new, old, adv, mask, unit_ids, weights = make_batch(7, clip)
    w = weights if use_weights else None
    norm = normalizer(mask, unit_ids)

    new_a = new.clone().requires_grad_(True)
    loss, metrics = LOSSES[name](
        new_a, old, adv, mask, unit_ids, 6, clip_low=lo, clip_high=hi, weights_N=w, aggregation=agg, norm=norm
    )
    loss.backward()

    new_b = new.clone().requires_grad_(True)
    ref, clip_frac, ratios = ref_loss(name, new_b, old, adv, mask, unit_ids, w, lo, hi, agg, norm)
    ref.backward()

    assert loss.dtype == torch.float64
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(new_a.grad, new_b.grad, rtol=1e-10, atol=1e-13)
    d = metrics.as_dict()
    assert d["train/clip_frac"] == pytest.approx(clip_frac)
    assert d["train/seq_ratio_min"] == pytest.approx(min(ratios), rel=1e-12)
    assert d["train/seq_ratio_max"] == pytest.approx(max(ratios), rel=1e-12)
    assert d["train/seq_ratio_mean"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-12)
    assert metrics.units == 5  # the unit without sampled tokens does not count


def test_clipping_is_exercised_on_both_sides():
    """The fixture really clips: low side (A<0, ratio below), high side (A>0, ratio above)."""
    new, old, adv, mask, unit_ids, _ = make_batch(7, 3e-4)
    norm = normalizer(mask, unit_ids)
    new_a = new.clone().requires_grad_(True)
    loss, m = LOSSES["gspo"](
        new_a, old, adv, mask, unit_ids, 6, clip_low=3e-4, clip_high=4e-4, aggregation="seq_mean_token_mean", norm=norm
    )
    loss.backward()
    grad_units = {u: float(new_a.grad[(unit_ids == u) & (mask > 0)].abs().sum()) for u in range(5)}
    # unit 0: A<0 and s ≈ 1-9e-4 below the band → clipped low, no gradient;
    # unit 4: A>0 and s ≈ 1+1.2e-3 above the band → clipped high, no gradient
    assert grad_units[0] == 0.0 and grad_units[4] == 0.0
    # unit 3: s above the band but A<0 → the unclipped term is the minimum, gradient flows;
    # units 1, 2 inside the band
    assert all(grad_units[u] > 0 for u in (1, 2, 3))
    assert 0 < m.clipped_tokens < m.tokens


def test_gspo_equals_gspo_token_when_advantage_and_weight_are_constant_per_unit():
    new, old, _, mask, unit_ids, _ = make_batch(3, 3e-4)
    adv = torch.tensor([1.0, -2.0, 0.5, 0.3, -0.1, 0.0], dtype=torch.float64)[unit_ids]
    norm = normalizer(mask, unit_ids)
    grads, losses = [], []
    for name in ("gspo", "gspo_token"):
        x = new.clone().requires_grad_(True)
        loss, _ = LOSSES[name](
            x, old, adv, mask, unit_ids, 6, clip_low=3e-4, clip_high=4e-4, aggregation="seq_mean_token_mean", norm=norm
        )
        loss.backward()
        grads.append(x.grad)
        losses.append(float(loss.detach()))
    assert losses[0] == pytest.approx(losses[1], rel=1e-12)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("agg", AGGS)
def test_microbatch_losses_add_up_to_the_full_batch(agg):
    """Global normalisers make the sum over micro-batches equal the one-shot loss."""
    new, old, adv, mask, unit_ids, _ = make_batch(11, 0.2)
    norm = normalizer(mask, unit_ids)
    full, _ = LOSSES["grpo"](new, old, adv, mask, unit_ids, 6, aggregation=agg, norm=norm)
    split = int((unit_ids < 3).sum())  # units 0-2 | units 3-5
    a, _ = LOSSES["grpo"](
        new[:split], old[:split], adv[:split], mask[:split], unit_ids[:split], 3, aggregation=agg, norm=norm
    )
    b, _ = LOSSES["grpo"](
        new[split:], old[split:], adv[split:], mask[split:], unit_ids[split:] - 3, 3, aggregation=agg, norm=norm
    )
    assert float(a + b) == pytest.approx(float(full), rel=1e-12)


def test_masked_tokens_carry_no_loss_or_gradient():
    new, old, adv, mask, unit_ids, _ = make_batch(5, 0.2)
    x = new.clone().requires_grad_(True)
    loss, _ = LOSSES["grpo"](x, old, adv, mask, unit_ids, 6, aggregation="token_mean", norm=normalizer(mask, unit_ids))
    loss.backward()
    assert torch.all(x.grad[mask == 0] == 0)
    old2 = old.clone()
    old2[mask == 0] = 123.0  # garbage where masked changes nothing
    loss2, _ = LOSSES["grpo"](
        new, old2, adv, mask, unit_ids, 6, aggregation="token_mean", norm=normalizer(mask, unit_ids)
    )
    assert float(loss2) == float(loss.detach())


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(torch.ones(2), torch.ones(2), torch.zeros(2, dtype=torch.long), 1, "mean", Normalizer(2, 1))  # type: ignore[arg-type]


def test_on_policy_gspo_gradient_is_the_advantage_weighted_mean_score():
    """At ratio 1 (old == new), ∇loss wrt logp_t = -A_u / (n_u · U) for every sampled token."""
    new, _, adv, mask, unit_ids, _ = make_batch(2, 3e-4)
    x = new.clone().requires_grad_(True)
    norm = normalizer(mask, unit_ids)
    loss, m = LOSSES["gspo"](x, new.clone(), adv, mask, unit_ids, 6, aggregation="seq_mean_token_mean", norm=norm)
    loss.backward()
    units = units_of(unit_ids, mask)
    for toks in units.values():
        if toks:
            a_u = float(sum(adv[t] for t in toks) / len(toks))
            for t in toks:
                assert float(x.grad[t]) == pytest.approx(-a_u / (len(toks) * norm.units), rel=1e-12)
    assert m.clipped_tokens == 0
    assert math.isclose(m.as_dict()["train/seq_ratio_max"], 1.0)
