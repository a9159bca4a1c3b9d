"""Shared-prefix packing equals packed recompute: logprobs, loss and every gradient.

Trajectories shaped like a harness's: one long system prompt shared by every segment, a
task statement shared within each group, then each rollout's own completions and tool
outputs; one trajectory shares nothing. fp32 on the CPU, tiny random-init models.
"""

from __future__ import annotations

import pytest
import torch

from legorl.model_families import build
from legorl.train import varlen
from legorl.train.batch import pack
from legorl.train.carried_state import share_alignment
from legorl.train.logprobs import LogprobOptions, LogprobOutput, PolicyModel
from legorl.train.routing import moe_routers
from legorl.train.shared_prefix import prefix_groups, sharing_refusal
from legorl.types import AlignmentStats, Segment, Trajectory
from tests.helpers.windowed_batches import harness_shaped, windowed_qwen3

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def _grads(policy: PolicyModel, mb, packing: str) -> tuple[LogprobOutput, dict[str, torch.Tensor]]:
    policy.zero_grad(set_to_none=True)
    out = policy(mb, LogprobOptions(packing=packing))
    loss = -(out.logprobs_N * mb.advantages_N * mb.mask_N).sum() / mb.mask_N.sum()
    loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}


def _policy(family: str) -> PolicyModel:
    lm = build(family).float()
    lm.set_attn_implementation(varlen.register())
    return PolicyModel(lm)


def _routing(policy: PolicyModel) -> tuple[int, int, int] | None:
    routers = moe_routers(policy.lm)
    return (len(routers), routers[0].top_k, routers[0].weight.shape[0]) if routers else None


def _shared_counted(policy: PolicyModel, mb) -> tuple[LogprobOutput, dict[str, torch.Tensor], list[int]]:
    """The shared-prefix step's output and gradients, and the token count of each decoder call."""
    computed: list[int] = []
    hook = policy.lm.get_decoder().register_forward_hook(
        lambda m, a, kw, out: computed.append(kw["input_ids"].numel()), with_kwargs=True
    )
    try:
        out, grads = _grads(policy, mb, "shared_prefix")
    finally:
        hook.remove()
    return out, grads, computed


def _same_step(policy: PolicyModel, mb) -> list[int]:
    """Shared-prefix equals packed (logprobs, every gradient, the routing used); returns the
    token counts of the shared step's decoder calls."""
    ref, ref_grads = _grads(policy, mb, "packed")
    out, grads, computed = _shared_counted(policy, mb)
    torch.testing.assert_close(out.logprobs_N.detach(), ref.logprobs_N.detach(), rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(
            g, ref_grads[name], rtol=1e-5, atol=1e-6 * float(ref_grads[name].abs().max()) + 1e-8, msg=name
        )
    if policy.is_moe:
        assert torch.equal(out.used_N_L_K, ref.used_N_L_K)  # routing replay unchanged
        assert torch.equal(out.used_N_L_K, mb.replay_N_L_K)
    return computed


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe", "glm4_moe", "gpt_oss", "qwen3_5", "qwen3_5_moe"])
def test_shared_prefix_equals_packed(family: str) -> None:
    policy = _policy(family)
    assert policy.sharing is None
    vocab = int(policy.lm.config.vocab_size)
    trajs = harness_shaped(torch.Generator().manual_seed(0), vocab, _routing(policy))
    (mb,) = pack([(i, t, 1.0 + 0.1 * i) for i, t in enumerate(trajs)], "trajectory", 1 << 20)
    groups = prefix_groups(mb.input_ids_N, mb.segment_lengths)
    assert groups and sum(len(g.members) for g in groups) == 6  # the lone trajectory is packed as before
    computed = _same_step(policy, mb)
    # the system prompt once (less the token every member keeps), each task's statement once
    # per group, then every member's own remainder; the lone trajectory packed as before.
    # A Gated-DeltaNet hybrid's shared spans end on a chunk of its delta rule (carried_state.py)
    align = share_alignment(policy.lm.config)
    system, statements = 119 - 119 % align, [159 + t - (159 + t) % align for t in range(2)]
    own = sum(n - statements[t // 3] for t, n in enumerate(mb.segment_lengths[:6]))
    assert sum(computed) == system + sum(s - system for s in statements) + own + 60


def test_members_whose_recorded_routing_differs_share_only_where_it_agrees() -> None:
    policy = _policy("qwen3_moe")
    trajs = harness_shaped(torch.Generator().manual_seed(2), int(policy.lm.config.vocab_size), _routing(policy))
    rows = trajs[1].segments[0].routed_experts
    rows[80] = [list(reversed(r)) for r in rows[80]]  # one rollout's engine routed one prompt token otherwise
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 1 << 20)
    computed = _same_step(policy, mb)
    assert computed[0] == 80  # the system prompt is shared only up to the disagreement


def test_groups_leave_every_member_a_token_of_its_own() -> None:
    ids = torch.tensor([5] * 40 + [5] * 40 + [5] * 41)  # three segments, one a copy of another
    groups = prefix_groups(ids, [40, 40, 41], min_share=8)
    assert [(g.length, g.members) for g in groups] == [(39, (0, 1, 2))]


def test_a_family_that_cannot_share_says_why_and_falls_back() -> None:
    policy = _policy("qwen2_moe")  # not verified
    why = sharing_refusal(policy.lm)
    assert why is not None and "qwen2_moe" in why and "packed instead" in why
    trajs = harness_shaped(torch.Generator().manual_seed(1), int(policy.lm.config.vocab_size))
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 1 << 20)
    with torch.no_grad():
        a = policy(mb, LogprobOptions(packing="packed"))
        b = policy(mb, LogprobOptions(packing="shared_prefix"))
    assert torch.equal(a.logprobs_N, b.logprobs_N)


def test_a_one_token_branch_starts_from_the_carried_state() -> None:
    """Branches of one token take the layer's one-token path (the recurrent rule, the
    convolution over the carried window); the prefix's states stay the siblings' too."""
    policy = _policy("qwen3_5")
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, 4096, (129,), generator=g).tolist()  # rollouts that ended alike: 128 shared, 1 own
    trajs = [
        Trajectory(f"t{k}", [Segment([0], ids, [0] * 120 + [1] * 9, [-1.0] * 129, [0])], AlignmentStats())
        for k in range(3)
    ]
    (mb,) = pack([(i, t, 1.0 + i) for i, t in enumerate(trajs)], "trajectory", 1 << 20)
    ref, ref_grads = _grads(policy, mb, "packed")
    out, grads, computed = _shared_counted(policy, mb)
    assert computed == [128, 1, 1, 1]
    torch.testing.assert_close(out.logprobs_N.detach(), ref.logprobs_N.detach(), rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        # the decay's gradient (A_log, dt_bias, in_proj_a: a sum whose terms nearly cancel, here
        # ~4e-6 at most) moves up to 2% of its size between the chunked and the one-token rule;
        # packed's own float32 value is 1-2% away from one with the delta rule in float64, where
        # the two agree to 2e-7: rounding, not a missing term
        decay = any(k in name for k in ("A_log", "dt_bias", "in_proj_a"))
        scale = float(ref_grads[name].abs().max())
        atol = (5e-2 if decay else 1e-6) * scale + 1e-8
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-5, atol=atol, msg=name)


def test_gradient_checkpointing_falls_back_to_packed() -> None:
    """transformers drops a layer's cache under gradient checkpointing: a branch would lose its prefix."""
    policy = _policy("qwen3")
    policy.lm.train()
    policy.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trajs = harness_shaped(torch.Generator().manual_seed(5), int(policy.lm.config.vocab_size))
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 1 << 20)
    ref, _ = _grads(policy, mb, "packed")
    out, _ = _grads(policy, mb, "shared_prefix")
    assert torch.equal(out.logprobs_N, ref.logprobs_N)


def test_a_windowed_qwen3_shares_exactly_and_only_under_its_masking_attention() -> None:
    policy = windowed_qwen3(["sliding_attention", "full_attention"])  # layer 0 sees 8 tokens back, layer 1 everything
    assert policy.sharing is None
    trajs = harness_shaped(torch.Generator().manual_seed(3), int(policy.lm.config.vocab_size))
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 1 << 20)
    _same_step(policy, mb)
    why = windowed_qwen3(["sliding_attention", "full_attention"], attention="sdpa").sharing
    assert why is not None and "'sdpa'" in why and "packed instead" in why


@pytest.mark.parametrize(("q_len", "k_len"), [(37, 37), (11, 40)])  # a whole segment; a branch after a prefix
def test_windowed_attention_in_query_blocks_equals_one_full_mask(q_len: int, k_len: int) -> None:
    """Blocks of 4 queries, each with only the keys a 5-token window reaches, compute what one
    (q_len x k_len) windowed causal mask does: with a window the cost is linear, not quadratic."""
    from types import SimpleNamespace

    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, q_len, 8, generator=g)
    k, v = (torch.randn(1, 2, k_len, 8, generator=g) for _ in range(2))
    module = SimpleNamespace(num_key_value_groups=2, training=False)
    whole = varlen.windowed(eager_attention_forward, module, q, k, v, 5, 0.0, 0.35, {}, block=q_len)
    blocked = varlen.windowed(eager_attention_forward, module, q, k, v, 5, 0.0, 0.35, {}, block=4)
    assert blocked.shape == (1, q_len, 4, 8)
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)
