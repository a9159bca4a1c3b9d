"""A windowed model's unseen head is not computed, and nothing it trains changes.

Every layer of `harness-qwen3` attends through a sliding window, so a sampled token's logprob
depends only on the few hundred tokens before it, not on the rest of a harness's 15-26k-token
first prompt. `pack(..., receptive=...)` drops that rest; these tests hold the trimmed step
to the whole one (logprobs per trajectory and every gradient), under both packings, and check
where trimming must not happen. fp32 on the CPU, tiny random-init models.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from legorl.train import varlen
from legorl.train.batch import pack, unseen_head
from legorl.train.kept_logprobs import split_segments
from legorl.train.logprobs import LogprobOptions, PolicyModel
from legorl.train.receptive_field import receptive_field
from legorl.train.shared_prefix import prefix_groups
from legorl.types import Segment
from tests.helpers.windowed_batches import harness_shaped, windowed_qwen3

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def _step(policy: PolicyModel, mb, packing: str) -> tuple[dict[int, torch.Tensor], dict[str, torch.Tensor]]:
    """Each trajectory's sampled-token logprobs (in order) and every parameter's gradient."""
    policy.zero_grad(set_to_none=True)
    out = policy(mb, LogprobOptions(packing=packing))
    loss = -(out.logprobs_N * mb.advantages_N * mb.mask_N).sum() / mb.mask_N.sum()
    loss.backward()
    per_traj = {int(t): out.logprobs_N[(mb.traj_ids_N == t) & (mb.mask_N > 0)].detach() for t in mb.traj_ids_N.unique()}
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
    return per_traj, grads


@pytest.mark.parametrize("packing", ["packed", "shared_prefix"])
def test_the_trimmed_step_equals_the_whole_one(packing: str) -> None:
    policy = windowed_qwen3(["sliding_attention"] * 2)
    assert policy.receptive == 16  # 2 layers x window 8
    trajs = harness_shaped(torch.Generator().manual_seed(5), int(policy.lm.config.vocab_size))
    items = [(i, t, 1.0 + 0.1 * i) for i, t in enumerate(trajs)]
    (whole,) = pack(items, "trajectory", 1 << 20)
    (trimmed,) = pack(items, "trajectory", 1 << 20, receptive=policy.receptive)
    assert trimmed.num_tokens < whole.num_tokens / 2  # the 160-token prompts are mostly beyond reach
    assert trimmed.mask_N.sum() == whole.mask_N.sum()  # no sampled token is dropped
    ref, ref_grads = _step(policy, whole, packing)
    got, grads = _step(policy, trimmed, packing)
    assert got.keys() == ref.keys()
    for t in ref:
        torch.testing.assert_close(got[t], ref[t], rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        scale = float(ref_grads[name].abs().max())
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6 * scale + 1e-8, msg=name)


def test_positions_are_the_recorded_ones() -> None:
    """A kept token keeps its position (the engine's rotary angle), not one shifted to 0."""
    trajs = harness_shaped(torch.Generator().manual_seed(1), 100)
    seg = trajs[0].segments[0]
    h = unseen_head(seg, 16)
    assert h == seg.loss_mask.index(1) - 1 - 16 > 0
    (mb,) = pack([(0, trajs[0], 1.0)], "trajectory", 1 << 20, receptive=16)
    assert mb.position_ids_N.tolist() == list(range(h, len(seg.token_ids)))
    assert mb.input_ids_N.tolist() == seg.token_ids[h:]


def test_a_short_head_or_no_sample_is_left_whole() -> None:
    seg = Segment([0], list(range(3, 40)), [0] * 10 + [1] * 27, [0.0] * 37, [0])
    assert unseen_head(seg, 16) == 0  # the first sample is 10 tokens in: all of it is seen
    assert unseen_head(Segment([0], [5] * 50, [0] * 50, [0.0] * 50, [0]), 16) == 0
    assert unseen_head(seg, None) == 0


@pytest.mark.parametrize(
    ("layer_types", "attention", "why"),
    [
        (["sliding_attention", "full_attention"], None, "a full-attention layer sees every token"),
        (["sliding_attention"] * 2, "sdpa", "sdpa's packed masks come from position ids restarting at 0"),
        (["sliding_attention"] * 2, "eager", "likewise eager"),
    ],
)
def test_no_trim_where_it_would_not_be_exact(layer_types: list[str], attention: str | None, why: str) -> None:
    assert windowed_qwen3(layer_types, attention=attention).receptive is None, why


def test_no_trim_under_length_dependent_rope() -> None:
    policy = windowed_qwen3(["sliding_attention"] * 2)
    policy.lm.config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    assert receptive_field(policy.lm) is None


def test_the_paper_table_policy_is_trimmed_to_its_two_windows() -> None:
    from legorl.models import resolve_model

    cfg = Qwen3Config.from_pretrained(resolve_model("harness-qwen3"))
    lm = Qwen3ForCausalLM(cfg)
    lm.set_attn_implementation(varlen.register())
    assert receptive_field(lm) == 2 * 256


def test_kept_logprobs_stay_aligned_with_the_whole_segment() -> None:
    policy = windowed_qwen3(["sliding_attention"] * 2)
    trajs = harness_shaped(torch.Generator().manual_seed(2), int(policy.lm.config.vocab_size))
    items = [(i, t, 1.0) for i, t in enumerate(trajs)]
    (whole,) = pack(items, "trajectory", 1 << 20)
    (trimmed,) = pack(items, "trajectory", 1 << 20, receptive=policy.receptive)
    with torch.no_grad():
        ref = {(t, s): lp for t, s, lp in split_segments(whole, policy(whole, LogprobOptions()).logprobs_N)}
        got = {(t, s): lp for t, s, lp in split_segments(trimmed, policy(trimmed, LogprobOptions()).logprobs_N)}
    assert got.keys() == ref.keys()
    for key, lp in ref.items():
        assert len(got[key]) == len(trajs[key[0]].segments[key[1]].token_ids) == len(lp)
        mask = torch.tensor(trajs[key[0]].segments[key[1]].loss_mask, dtype=torch.bool)
        torch.testing.assert_close(torch.from_numpy(got[key])[mask], torch.from_numpy(lp)[mask], rtol=1e-5, atol=1e-5)


def test_the_same_tokens_at_another_position_are_not_shared() -> None:
    ids = list(range(3, 60))
    ids_N = torch.tensor(ids + ids)
    lengths = [len(ids), len(ids)]
    assert prefix_groups(ids_N, lengths, pos_N=torch.cat([torch.arange(57), torch.arange(57)]))
    assert not prefix_groups(ids_N, lengths, pos_N=torch.cat([torch.arange(57), torch.arange(9, 66)]))
