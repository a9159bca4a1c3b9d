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
from legorl.train.logprobs import LogprobOptions, PolicyModel
from legorl.train.shared_prefix import prefix_groups, sharing_refusal
from legorl.types import AlignmentStats, Segment, Trajectory

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def harness_shaped(g: torch.Generator, vocab: int) -> list[Trajectory]:
    system = torch.randint(3, vocab, (120,), generator=g).tolist()
    trajs = []
    for task in range(2):
        statement = torch.randint(3, vocab, (40 + task,), generator=g).tolist()  # > MIN_SHARE: a second level
        for k in range(3):
            turn = torch.randint(3, vocab, (15 + 4 * k,), generator=g).tolist()
            obs = torch.randint(3, vocab, (10,), generator=g).tolist()
            last = torch.randint(3, vocab, (7 + k,), generator=g).tolist()
            ids = system + statement + turn + obs + last
            mask = [0] * len(system + statement) + [1] * len(turn) + [0] * len(obs) + [1] * len(last)
            lps = [-1.0 * m for m in mask]
            trajs.append(
                Trajectory(
                    f"t{task}-{k}", [Segment([0, 1], ids, mask, lps, [0, 0])], AlignmentStats(), instance_id=f"x{task}"
                )
            )
    alone = torch.randint(3, vocab, (60,), generator=g).tolist()
    trajs.append(
        Trajectory("alone", [Segment([0], alone, [0] * 40 + [1] * 20, [0.0] * 40 + [-1.0] * 20, [0])], AlignmentStats())
    )
    return trajs


def _grads(policy: PolicyModel, mb, packing: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    policy.zero_grad(set_to_none=True)
    out = policy(mb, LogprobOptions(packing=packing))
    loss = -(out.logprobs_N * mb.advantages_N * mb.mask_N).sum() / mb.mask_N.sum()
    loss.backward()
    return out.logprobs_N.detach(), {
        n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_shared_prefix_equals_packed(family: str) -> None:
    lm = build(family).float()
    lm.set_attn_implementation(varlen.register())
    policy = PolicyModel(lm)
    assert policy.sharing is None
    vocab = int(lm.config.vocab_size)
    trajs = harness_shaped(torch.Generator().manual_seed(0), vocab)
    (mb,) = pack([(i, t, 1.0 + 0.1 * i) for i, t in enumerate(trajs)], "trajectory", 1 << 20)
    groups = prefix_groups(mb.input_ids_N, mb.segment_lengths)
    assert groups and sum(len(g.members) for g in groups) == 6  # the lone trajectory is packed as before
    ref_lp, ref_grads = _grads(policy, mb, "packed")
    computed: list[int] = []
    hook = lm.get_decoder().register_forward_hook(
        lambda m, a, kw, out: computed.append(kw["input_ids"].numel()), with_kwargs=True
    )
    lp, grads = _grads(policy, mb, "shared_prefix")
    hook.remove()
    # the system prompt once (less the token every member keeps), each task's statement once
    # per group, then every member's own remainder; the lone trajectory packed as before
    own = sum(n - 119 - (40 + t // 3) for t, n in enumerate(mb.segment_lengths[:6]))
    assert sum(computed) == 119 + 40 + 41 + own + 60
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(
            g, ref_grads[name], rtol=1e-5, atol=1e-6 * float(ref_grads[name].abs().max()) + 1e-8, msg=name
        )


def test_groups_leave_every_member_a_token_of_its_own() -> None:
    ids = torch.tensor([5] * 40 + [5] * 40 + [5] * 41)  # three segments, one a copy of another
    groups = prefix_groups(ids, [40, 40, 41], min_share=8)
    assert [(g.length, g.members) for g in groups] == [(39, (0, 1, 2))]


def test_a_family_that_cannot_share_says_why_and_falls_back() -> None:
    lm = build("qwen3_moe")
    lm.set_attn_implementation(varlen.register())
    policy = PolicyModel(lm)
    why = sharing_refusal(lm, policy.is_moe)
    assert why is not None and "MoE" in why and "packed instead" in why
    trajs = harness_shaped(torch.Generator().manual_seed(1), int(lm.config.vocab_size))
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 1 << 20)
    with torch.no_grad():
        a = policy(mb, LogprobOptions(packing="packed"))
        b = policy(mb, LogprobOptions(packing="shared_prefix"))
    assert torch.equal(a.logprobs_N, b.logprobs_N)
