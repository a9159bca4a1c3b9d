"""The trainer on each supported family: packed recompute equals the hf engine's rollouts
(Pearson ≥ 0.9999, fp32) with routing mismatch 0 under replay; packed segments stay apart in
linear-attention (Gated-DeltaNet) and sink/sliding-window layers; each router adapter
replays the selection with live gate weights and is bitwise neutral without a replay."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from torch import nn

from legorl.engine.hf import HFEngine
from legorl.model_families import build, save
from legorl.train.batch import pack
from legorl.train.config import TrainerConfig
from legorl.train.logprobs import LogprobOptions, PolicyModel
from legorl.train.routing import moe_routers, moe_routing, routing_mismatch
from legorl.train.trainer import load_lm
from legorl.types import AlignmentStats, Segment, Trajectory
from tests.helpers.logprob_util import engine_session, pearson

pytestmark = pytest.mark.usefixtures("one_thread_per_module")

FAMILIES = ["qwen3_5_moe", "qwen3_5", "gpt_oss", "glm4_moe", "deepseek_v3", "qwen2_moe"]
MOE = ["qwen3_5_moe", "gpt_oss", "glm4_moe", "deepseek_v3", "qwen2_moe"]


@pytest.mark.parametrize("family", FAMILIES)
async def test_packed_recompute_matches_the_hf_engine(family: str, tmp_path) -> None:
    path = str(save(family, tmp_path / family))
    engine = HFEngine(path, seed=3)
    try:
        g = torch.Generator().manual_seed(2)
        trajs = await asyncio.gather(*(engine_session(engine, g, f"s{i}", 0.8) for i in range(3)))
    finally:
        await engine.close()
    trajs = [dataclasses.replace(t, instance_id="task") for t in trajs]
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 10_000)
    assert len(mb.segment_lengths) == 3  # three sessions packed in one row
    lm = load_lm(TrainerConfig(model=path)).eval()
    with torch.no_grad():
        out = PolicyModel(lm)(mb, LogprobOptions(temperature=0.8))
    sel = mb.mask_N > 0
    assert pearson(out.logprobs_N[sel].exp(), mb.rollout_logprobs_N[sel].exp()) >= 0.9999
    assert float((out.logprobs_N[sel] - mb.rollout_logprobs_N[sel]).abs().max()) < 1e-4
    if family in MOE:
        assert mb.replay_N_L_K is not None and bool((mb.replay_N_L_K >= 0).all())
        assert routing_mismatch(out.used_N_L_K, mb.replay_N_L_K, torch.ones(mb.num_tokens, dtype=torch.bool))[0] == 0
    else:
        assert out.used_N_L_K is None


@pytest.mark.parametrize("family", ["qwen3_5_moe", "gpt_oss"])
def test_packed_segments_stay_apart_in_linear_and_windowed_layers(family: str) -> None:
    """A segment's logprobs do not depend on the segment packed before it, and equal its
    forward alone: Gated-DeltaNet state and convolution, sinks, sliding window included."""
    lm = build(family)
    from legorl.train import varlen

    lm.set_attn_implementation(varlen.register())
    a = Segment([0], list(range(5, 25)), [0] * 10 + [1] * 10, [0.0] * 20, [0])
    b = Segment([0], list(range(100, 130)), [0] * 10 + [1] * 20, [0.0] * 30, [0])
    b2 = Segment([0], list(range(200, 230)), [0] * 10 + [1] * 20, [0.0] * 30, [0])
    policy = PolicyModel(lm)
    opts = LogprobOptions(packing="packed", routing_replay=False)

    def run(*segs: Segment):
        (mb,) = pack([(0, Trajectory("x", list(segs), AlignmentStats(), instance_id="t"), 1.0)], "segment", 100)
        with torch.no_grad():
            return policy(mb, opts).logprobs_N

    out1, out2, alone = run(b, a), run(b2, a), run(a)
    assert not torch.equal(out1[:30], out2[:30])
    torch.testing.assert_close(out1[30:], out2[30:], rtol=0, atol=1e-6)
    torch.testing.assert_close(out1[30:], alone, rtol=0, atol=1e-5)


def experts_inputs(lm: nn.Module) -> tuple[list, list]:
    """Independent record of what each experts module received: (indices, weights)."""
    seen: list = []
    handles = []
    for m in lm.modules():
        if hasattr(m, "experts") and isinstance(m.experts, nn.Module):

            def pre(_m, args, _seen=seen):
                _seen.append((args[1].detach().clone(), args[2].detach().clone()))

            handles.append(m.experts.register_forward_pre_hook(pre))
    return seen, handles


@pytest.mark.parametrize("family", MOE)
def test_adapter_replays_selection_with_live_gate_weights(family: str) -> None:
    lm = build(family)
    routers = moe_routers(lm)
    ids = torch.randint(3, 4096, (1, 15), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = lm(input_ids=ids).logits
        with moe_routing(lm) as rec:
            neutral = lm(input_ids=ids).logits
    assert torch.equal(plain, neutral)  # no replay: bitwise what the model computes
    natural = rec.first_call("natural")
    assert torch.equal(rec.first_call("used"), natural)
    # a replay equal to the router's own choice changes nothing either
    with torch.no_grad(), moe_routing(lm, natural.clone()):
        assert torch.equal(lm(input_ids=ids).logits, plain)
    # another selection: used exactly, weights = the model's own rule at the replayed experts
    g = torch.Generator().manual_seed(1)
    E, K = routers[0].weight.shape[0], routers[0].top_k
    replay = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(15 * len(routers))]).view(
        15, len(routers), K
    )
    replay[4] = -1  # not recorded: the router decides
    seen, handles = experts_inputs(lm)
    router_in: list[torch.Tensor] = []
    hooks = [
        r.register_forward_pre_hook(lambda _m, a: router_in.append(a[0].detach().reshape(-1, a[0].shape[-1])))
        for r in routers
    ]
    try:
        with torch.no_grad(), moe_routing(lm, replay):
            lm(input_ids=ids)
    finally:
        for h in handles + hooks:
            h.remove()
    assert len(seen) == len(routers)
    for layer, (idx, weights) in enumerate(seen):
        want = replay[:, layer].clone()
        want[4] = natural[4, layer]
        assert torch.equal(idx, want)
        # the unpatched router, on the same input, with its own choice: its weights at its experts
        _, own_w, own_idx = type(routers[layer]).forward(routers[layer], router_in[layer])
        torch.testing.assert_close(weights[4], own_w[4], rtol=0, atol=1e-6)
        assert torch.equal(own_idx[4], natural[4, layer].to(own_idx.dtype))
        assert not torch.equal(weights[:4], own_w[:4])  # recomputed for the replayed experts


@pytest.mark.parametrize("family", MOE)
def test_router_still_learns_under_replay(family: str) -> None:
    lm = build(family).train()
    routers = moe_routers(lm)
    E, K = routers[0].weight.shape[0], routers[0].top_k
    g = torch.Generator().manual_seed(4)
    replay = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(12 * len(routers))]).view(
        12, len(routers), K
    )
    ids = torch.randint(3, 4096, (1, 12), generator=g)
    with moe_routing(lm, replay):
        lm(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
    for r in routers:
        assert r.weight.grad is not None and float(r.weight.grad.abs().sum()) > 0


def test_a_router_without_adapter_is_refused_by_name() -> None:
    class MysteryTopKRouter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(4, 8))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Linear(8, 4)
            self.experts = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])

    model = build("qwen3_moe")
    model.model.layers[0].mlp.gate = MysteryTopKRouter()
    with pytest.raises(ValueError, match="MysteryTopKRouter"):
        moe_routers(model)
    with pytest.raises(ValueError, match=r"\(Linear\)"):  # an MoE block whose gate is a bare linear layer
        moe_routers(Block())


def test_trainer_step_on_qwen3_5_moe_replays_routing_with_and_without_checkpointing(tmp_path) -> None:
    """The paper's architecture through a whole GSPO step: packed rows through Gated-DeltaNet
    and attention layers, a replay that differs from the router's choice, and gradient
    checkpointing (recomputed layers must route and keep segments apart as the forward did)."""
    import argparse

    from legorl.train import minimal
    from legorl.train.trainer import Trainer

    path = str(save("qwen3_5_moe", tmp_path / "m"))
    args = argparse.Namespace(prompts_per_step=1, group_size=4, prompt_len=8, new_tokens=8, target_tokens=256, seed=0)
    results = []
    for gc in (False, True):
        trainer = Trainer(TrainerConfig(model=path, lr=1e-2, gradient_checkpointing=gc, seed=1))
        trajs, _ = minimal.rollouts(trainer.lm, 0, args)
        for t in trajs:
            routing = torch.tensor(t.segments[0].routed_experts)
            t.segments[0].routed_experts = ((routing + 1) % 8).tolist()
        m = trainer.step(trajs)
        assert m["mismatch/routing_mismatch"] == 0.0 and m["mismatch/router_disagreement"] > 0.5
        results.append([p.detach().clone() for p in trainer.lm.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("family", ["qwen3_5_moe", "qwen3_5"])
def test_fused_packed_gated_deltanet_equals_per_segment_forwards(family: str) -> None:
    """The GPU path (one pass over the row, varlen rule) re-states the layer's forward; on CPU
    its rule runs per segment, and the whole must equal the layer's own per-segment forwards,
    values and gradients (segments of 1 and 3 tokens, shorter than the conv kernel, included)."""
    from legorl.train.linear_varlen import fusable, fused_packed_forward, linear_attention_layers, per_segment_forward

    layer = linear_attention_layers(build(family))[0]
    assert fusable(layer)
    bounds = [0, 3, 20, 21, 50]
    h = torch.randn(1, 50, 64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    up = torch.randn(1, 50, 64, generator=torch.Generator().manual_seed(1))
    grads = []
    for fn in (fused_packed_forward, per_segment_forward):
        h.grad = None
        layer.zero_grad()
        out = fn(layer, h, bounds)
        (out * up).sum().backward()
        grads.append((out.detach(), h.grad.clone(), layer.in_proj_qkv.weight.grad.clone(), layer.A_log.grad.clone()))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_fused_path_is_checked_once_and_falls_back_when_wrong(monkeypatch, caplog) -> None:
    """What a GPU run takes (forced here on CPU): the fused path, verified against per-segment
    forwards at its first packed call; a fused result that disagrees is dropped for good."""
    from legorl.train import linear_varlen

    lm = build("qwen3_5_moe")
    from legorl.train import varlen

    lm.set_attn_implementation(varlen.register())
    g = torch.Generator().manual_seed(5)
    segs = [
        Segment([0], torch.randint(3, 4096, (n,), generator=g).tolist(), [0] * 4 + [1] * (n - 4), [0.0] * n, [0])
        for n in (9, 14, 6)
    ]
    (mb,) = pack([(0, Trajectory("x", segs, AlignmentStats(), instance_id="t"), 1.0)], "segment", 100)
    policy = PolicyModel(lm)
    with torch.no_grad():
        want = policy(mb, LogprobOptions(packing="per_segment")).logprobs_N
    monkeypatch.setattr(linear_varlen, "fused_wanted", lambda h: True)
    monkeypatch.setattr(linear_varlen, "_fused_ok", {})
    calls = []
    real = linear_varlen.fused_packed_forward
    monkeypatch.setattr(linear_varlen, "fused_packed_forward", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        got = policy(mb, LogprobOptions(packing="packed")).logprobs_N
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert len(calls) == 3 and linear_varlen._fused_ok == {("Qwen3_5MoeGatedDeltaNet", "cpu"): True}
    # a fused kernel that mixed segments up: reported once, per-segment forwards from then on
    monkeypatch.setattr(linear_varlen, "_fused_ok", {})
    monkeypatch.setattr(
        linear_varlen, "fused_packed_forward", lambda layer, h, b: calls.append(1) or real(layer, h, [0, h.shape[1]])
    )
    calls.clear()
    with torch.no_grad():
        got = policy(mb, LogprobOptions(packing="packed")).logprobs_N
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert len(calls) == 1 and linear_varlen._fused_ok == {("Qwen3_5MoeGatedDeltaNet", "cpu"): False}
    assert "using per-segment forwards" in caplog.text
