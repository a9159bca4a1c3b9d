"""The sampling distribution engines report logprobs under, against a float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from legorl.engine.sampling import processed_logprobs, sample, token_logprobs
from legorl.types import SamplingParams


def reference(logits: list[float], temperature: float, top_p: float, top_k: int) -> list[float]:
    """Hand-written float64 version of sampling.py's definition, one row."""
    if temperature == 0:
        m = max(logits)
        z = math.log(sum(math.exp(x - m) for x in logits)) + m
        return [x - z for x in logits]
    scaled = [x / temperature for x in logits]
    keep = set(range(len(scaled)))
    if 0 < top_k < len(scaled):
        kth = sorted(scaled, reverse=True)[top_k - 1]
        keep = {i for i in keep if scaled[i] >= kth}
    if top_p < 1:
        m = max(scaled[i] for i in keep)
        z = sum(math.exp(scaled[i] - m) for i in keep)
        order = sorted(keep, key=lambda i: -scaled[i])
        mass, nucleus = 0.0, set()
        for i in order:
            if mass >= top_p and nucleus:
                break
            nucleus.add(i)
            mass += math.exp(scaled[i] - m) / z
        keep = nucleus
    m = max(scaled[i] for i in keep)
    z = math.log(sum(math.exp(scaled[i] - m) for i in keep)) + m
    return [scaled[i] - z if i in keep else -math.inf for i in range(len(scaled))]


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, -1), (0.7, 1.0, -1), (1.3, 0.9, -1), (0.8, 1.0, 5), (0.6, 0.5, 20), (0.0, 0.3, 3)],
)
def test_processed_logprobs_match_float64_reference(temperature: float, top_p: float, top_k: int) -> None:
    gen = torch.Generator().manual_seed(0)
    logits_B_V = torch.randn(4, 64, generator=gen, dtype=torch.float64) * 3
    B = logits_B_V.shape[0]
    got = processed_logprobs(
        logits_B_V,
        torch.full((B,), temperature),
        torch.full((B,), top_p),
        torch.full((B,), top_k, dtype=torch.long),
    )
    for r in range(B):
        want = torch.tensor(reference(logits_B_V[r].tolist(), temperature, top_p, top_k), dtype=torch.float32)
        assert torch.equal(torch.isinf(got[r]), torch.isinf(want))
        finite = ~torch.isinf(want)
        assert torch.allclose(got[r][finite], want[finite], atol=1e-5)
        assert math.isclose(float(got[r].exp().sum()), 1.0, rel_tol=1e-5)


def test_rows_with_different_params_are_processed_independently() -> None:
    logits_B_V = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
    mixed = processed_logprobs(
        logits_B_V, torch.tensor([1.0, 0.5, 0.0]), torch.tensor([1.0, 0.8, 1.0]), torch.tensor([-1, 4, -1])
    )
    for r, (t, p, k) in enumerate([(1.0, 1.0, -1), (0.5, 0.8, 4), (0.0, 1.0, -1)]):
        alone = processed_logprobs(logits_B_V[r : r + 1], torch.tensor([t]), torch.tensor([p]), torch.tensor([k]))
        assert torch.equal(mixed[r], alone[0])


def test_sample_is_argmax_for_greedy_and_reproducible_with_a_seed() -> None:
    logits_B_V = torch.randn(2, 50, generator=torch.Generator().manual_seed(2))
    lp = processed_logprobs(logits_B_V, torch.tensor([0.0, 1.0]), torch.ones(2), torch.full((2,), -1))
    greedy_B = torch.tensor([True, False])

    def draws(seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        return [sample(lp, greedy_B, [None, g], None).tolist() for _ in range(8)]

    first, again, other = draws(7), draws(7), draws(8)
    assert first == again
    assert [d[1] for d in first] != [d[1] for d in other]
    assert all(d[0] == int(logits_B_V[0].argmax()) for d in first)


def test_sampled_tokens_follow_the_processed_distribution() -> None:
    logits_B_V = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    lp = processed_logprobs(logits_B_V, torch.full((4000,), 1.0), torch.full((4000,), 0.8), torch.full((4000,), -1))
    ids = sample(lp, torch.zeros(4000, dtype=torch.bool), [None] * 4000, torch.Generator().manual_seed(3))
    assert int((ids >= 2).sum()) == 0  # outside the 0.8 nucleus {0, 1}
    p0 = float(lp[0, 0].exp())
    assert abs(float((ids == 0).float().mean()) - p0) < 0.03


def test_token_logprobs_gathers_the_sampled_ids() -> None:
    logits_T_V = torch.randn(5, 40, generator=torch.Generator().manual_seed(4))
    ids_T = torch.tensor([3, 1, 4, 1, 5])
    params = SamplingParams(temperature=0.9, top_p=0.95)
    got = token_logprobs(logits_T_V, ids_T, params)
    full = processed_logprobs(logits_T_V, torch.full((5,), 0.9), torch.full((5,), 0.95), torch.full((5,), -1))
    assert torch.equal(got, full[torch.arange(5), ids_T])


def test_a_seeded_row_draws_the_same_whatever_shares_its_batch() -> None:
    logits_V = torch.randn(64, generator=torch.Generator().manual_seed(5))
    lp_1_V = processed_logprobs(logits_V[None], torch.ones(1), torch.ones(1), torch.full((1,), -1))

    def draw(batch: int, row: int) -> list[int]:
        g = torch.Generator().manual_seed(11)
        gens = [g if r == row else None for r in range(batch)]
        lp = lp_1_V.repeat(batch, 1)
        return [
            int(sample(lp, torch.zeros(batch, dtype=torch.bool), gens, torch.Generator().manual_seed(batch))[row])
            for _ in range(6)
        ]

    assert draw(1, 0) == draw(5, 3) == draw(2, 1)
