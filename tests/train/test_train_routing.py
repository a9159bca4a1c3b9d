"""Routing replay (R3): recorded experts are used exactly, gate weights stay live."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from legorl.train.batch import pack
from legorl.train.config import TrainerConfig
from legorl.train.logprobs import LogprobOptions, PolicyModel
from legorl.train.routing import moe_routers, moe_routing, routing_mismatch
from legorl.train.sampler import sample
from legorl.train.trainer import load_lm
from legorl.types import AlignmentStats, Segment, Trajectory

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def lm():
    return load_lm(TrainerConfig(model="tiny-qwen3-moe"))


def experts_spy(lm):
    """Independent record of what each experts module actually received."""
    seen, handles = [], []
    for layer in lm.model.layers:

        def pre(_m, args, _seen=seen):
            _seen.append((args[1].detach().clone(), args[2].detach().clone()))

        handles.append(layer.mlp.experts.register_forward_pre_hook(pre))
    return seen, handles


def random_replay(n, layers, k, experts, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(n * layers)]).view(n, layers, k)


def test_replayed_experts_reach_the_experts_with_live_gate_weights(lm):
    ids = torch.randint(3, 4096, (1, 17), generator=torch.Generator().manual_seed(0))
    routers = moe_routers(lm)
    replay = random_replay(17, len(routers), 2, 8, seed=1)
    replay[5] = -1  # token 5 not recorded: the router decides
    router_inputs = []
    hooks = [
        r.register_forward_pre_hook(lambda _m, a: router_inputs.append(a[0].detach().reshape(-1, a[0].shape[-1])))
        for r in routers
    ]
    seen, spy = experts_spy(lm)
    try:
        with moe_routing(lm, replay) as rec:
            lm.model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks + spy:
            h.remove()
    natural = rec.first_call("natural")
    for layer, (idx, weights) in enumerate(seen):
        expected_idx = replay[:, layer].clone()
        expected_idx[5] = natural[5, layer]
        assert torch.equal(idx, expected_idx)
        probs = F.softmax(F.linear(router_inputs[layer], routers[layer].weight), dim=-1, dtype=torch.float)
        gathered = probs.gather(1, expected_idx)
        torch.testing.assert_close(weights, gathered / gathered.sum(-1, keepdim=True), rtol=0, atol=1e-7)
    assert routing_mismatch(rec.first_call("used"), replay, (replay >= 0).all(-1).all(-1)) == (0, 16 * 4)


def test_router_still_learns_under_replay(lm):
    ids = torch.randint(3, 4096, (1, 12), generator=torch.Generator().manual_seed(3))
    replay = random_replay(12, 4, 2, 8, seed=4)
    lm.zero_grad()
    with moe_routing(lm, replay):
        lm(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).sum().backward()
    for r in moe_routers(lm):
        assert r.weight.grad is not None and float(r.weight.grad.abs().sum()) > 0
    lm.zero_grad()


def test_without_replay_the_context_changes_nothing_and_restores_forward(lm):
    ids = torch.randint(3, 4096, (1, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        plain = lm.model(input_ids=ids, use_cache=False).last_hidden_state
        with moe_routing(lm) as rec:
            routed = lm.model(input_ids=ids, use_cache=False).last_hidden_state
    assert torch.equal(plain, routed)
    assert torch.equal(rec.first_call("used"), rec.first_call("natural"))
    assert all("forward" not in vars(r) for r in moe_routers(lm))
    with pytest.raises(ValueError, match="top_k"):
        with moe_routing(lm, torch.zeros(20, 4, 3, dtype=torch.long)):
            pass
    with pytest.raises(ValueError, match="expert 8"):
        with moe_routing(lm, torch.full((20, 4, 2), 8)):
            pass


def test_replay_makes_a_drifted_trainer_route_like_the_rollout(lm):
    """The sampler's router differs from the trainer's (weights drifted, as after an update
    or with another engine's numerics): without replay routing mismatches, with replay it is 0."""
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(3, 4096, (16,), generator=g).tolist()
    s = sample(lm, [prompt], max_new_tokens=12, temperature=1.0, generator=g)[0]
    seg = Segment([0], prompt + s.completion_ids, [0] * 16 + [1] * 12, [0.0] * 16 + s.logprobs, [0], s.routed_experts)
    (mb,) = pack([(0, Trajectory("x", [seg], AlignmentStats(), instance_id="t"), 1.0)], "trajectory", 100)
    saved = [r.weight.detach().clone() for r in moe_routers(lm)]
    try:
        with torch.no_grad():
            for r in moe_routers(lm):
                r.weight.add_(torch.randn(r.weight.shape, generator=g) * r.weight.std() * 0.5)
            policy = PolicyModel(lm)
            off = policy(mb, LogprobOptions(routing_replay=False))
            on = policy(mb, LogprobOptions(routing_replay=True))
    finally:
        with torch.no_grad():
            for r, w in zip(moe_routers(lm), saved, strict=True):
                r.weight.copy_(w)
    valid = (mb.replay_N_L_K >= 0).all(-1).all(-1)
    assert routing_mismatch(off.used_N_L_K, mb.replay_N_L_K, valid)[0] > 0
    assert routing_mismatch(on.used_N_L_K, mb.replay_N_L_K, valid)[0] == 0
    assert routing_mismatch(on.natural_N_L_K, mb.replay_N_L_K, valid)[0] > 0  # the router alone would differ
