"""The trainer end to end: it really learns, leaves infra errors out, syncs weights into a real
hf engine (in memory and from disk), and reports the documented metrics."""

from __future__ import annotations

import argparse
import copy
import dataclasses

import pytest
import torch

from legorl.engine.hf import HFEngine
from legorl.train import minimal
from legorl.train.config import TrainerConfig
from legorl.train.sync import DiskSync, InProcessSync, WeightSync
from legorl.train.trainer import Trainer, load_lm
from legorl.types import Outcome, Status

REQUIRED = [
    "train/loss",
    "train/clip_frac",
    "train/seq_ratio_min",
    "train/seq_ratio_mean",
    "train/seq_ratio_max",
    "train/entropy",
    "train/grad_norm",
    "train/lr",
    "mismatch/pearson",
    "mismatch/mean_abs_dp",
    "mismatch/max_abs_dp",
    "mismatch/k3_kl",
    "train/tokens_per_s",
    "policy/staleness_mean",
    "groups/zero_variance_share",
]


@pytest.fixture
def one_thread():
    """The toy runs are tiny: one thread is faster than two on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def toy_args(**kw):
    base = dict(prompts_per_step=2, group_size=8, prompt_len=8, new_tokens=8, target_tokens=256, seed=0)
    base.update(kw)
    return argparse.Namespace(**base)


def eval_reward(trainer: Trainer, positions: range, args) -> float:
    state = torch.get_rng_state()
    torch.manual_seed(12345)
    rewards = [minimal.rollouts(trainer.lm, p, args)[1] for p in positions]
    torch.set_rng_state(state)
    return sum(rewards) / len(rewards)


@pytest.mark.slow
def test_gspo_improves_the_toy_reward(one_thread):
    """A REAL optimisation: sampled groups of 8, GSPO updates, reward measured on held-out prompts."""
    trainer = Trainer(TrainerConfig(model="tiny-qwen3", lr=3e-2, seed=0))
    args = toy_args()
    held_out = range(10_000, 10_004)
    before = eval_reward(trainer, held_out, args)
    for step in range(10):
        trajs, _ = minimal.rollouts(trainer.lm, 2 * step, args)
        metrics = trainer.step(trajs)
        if step == 0:
            assert set(REQUIRED) <= set(metrics), set(REQUIRED) - set(metrics)
            assert metrics["mismatch/pearson"] > 0.9999 and metrics["policy/staleness_mean"] == 0
            assert metrics["train/seq_ratio_max"] == 1.0  # one optimizer step: π_old is this forward
    after = eval_reward(trainer, held_out, args)
    assert after >= before + 0.2, (before, after)


def test_infra_errors_do_not_change_the_update(one_thread):
    base = Trainer(TrainerConfig(model="tiny-qwen3", lr=1e-3))
    other = Trainer(TrainerConfig(model="tiny-qwen3", lr=1e-3))
    trajs, _ = minimal.rollouts(base.lm, 0, toy_args(prompts_per_step=1, group_size=4))
    broken = [
        dataclasses.replace(t, session_id=t.session_id + "-infra", outcome=Outcome(0.0, status))
        for t, status in zip(copy.deepcopy(trajs[:2]), [Status.SANDBOX_START_FAILED, Status.ENGINE_ERROR], strict=True)
    ]
    base.step(trajs)
    m = other.step(trajs + broken)
    assert m["groups/masked_trajectories"] == 2
    for a, b in zip(base.lm.parameters(), other.lm.parameters(), strict=True):
        assert torch.equal(a, b)


def test_staleness_minibatches_and_correction_metrics(one_thread):
    trainer = Trainer(
        TrainerConfig(model="tiny-qwen3", lr=1e-2, minibatches=2, correction="tis", loss="gspo", sequence_unit="turn")
    )
    trajs, _ = minimal.rollouts(trainer.lm, 0, toy_args(prompts_per_step=2, group_size=4))
    trainer.version = 3
    for t in trajs:
        t.segments[0].policy_versions = [1]
    m = trainer.step(trajs)
    assert m["policy/staleness_mean"] == 2 and m["policy/staleness_max"] == 2
    assert m["train/optimizer_steps"] == 2
    assert m["policy/version"] == 4
    assert m["train/seq_ratio_min"] < 1.0 or m["train/seq_ratio_max"] > 1.0  # 2nd minibatch is off-policy
    assert "mismatch/corrected_frac" in m


def test_gradient_checkpointing_replays_routing_in_backward(one_thread):
    """MoE + replay: recomputed layers in backward must route like the forward did."""
    results = []
    for gc in (False, True):
        trainer = Trainer(TrainerConfig(model="tiny-qwen3-moe", lr=1e-2, gradient_checkpointing=gc, seed=1))
        trajs, _ = minimal.rollouts(trainer.lm, 0, toy_args(prompts_per_step=1, group_size=4))
        for t in trajs:  # a replay that differs from the router's own choice
            routing = torch.tensor(t.segments[0].routed_experts)
            t.segments[0].routed_experts = ((routing + 1) % 8).tolist()
        m = trainer.step(trajs)
        assert m["mismatch/routing_mismatch"] == 0.0 and m["mismatch/router_disagreement"] > 0.5
        results.append([p.detach().clone() for p in trainer.lm.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


async def test_weight_sync_into_a_real_hf_engine(tmp_path, one_thread):
    engine = HFEngine("tiny-qwen3", device="cpu", dtype="float32")
    try:
        for sync in (InProcessSync(engine), DiskSync([engine], tmp_path / "weights", keep=1)):
            assert isinstance(sync, WeightSync)
            trainer = Trainer(TrainerConfig(model="tiny-qwen3", lr=1e-2), weight_sync=sync)
            trajs, _ = minimal.rollouts(trainer.lm, 0, toy_args(prompts_per_step=1, group_size=4))
            trajs = [
                dataclasses.replace(t, outcome=Outcome(r, Status.RESOLVED))
                for t, r in zip(trajs, [1.0, 0.0, 0.5, 0.0], strict=True)
            ]
            await trainer.train_step(trajs)
            await trainer.train_step(trajs)
            assert engine.policy_version == trainer.version == 2
            mine, theirs = trainer.lm.state_dict(), engine.model.state_dict()
            assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        assert [p.name for p in (tmp_path / "weights").iterdir()] == ["v00000002"]
    finally:
        await engine.close()
    with pytest.raises(TypeError, match="update_weights"):
        InProcessSync(object())


def test_bf16_keeps_fp32_master_weights(one_thread):
    """dtype bfloat16 computes in bf16 but updates fp32 parameters (FSDP2 mixed precision on a
    one-rank group), so small updates are not rounded away."""
    import torch.distributed as dist

    trainer = Trainer(TrainerConfig(model="tiny-qwen3", dtype="bfloat16", lr=1e-6))
    try:
        sampler = load_lm(TrainerConfig(model="tiny-qwen3"))  # the engine's fp32 copy
        trajs, _ = minimal.rollouts(sampler, 0, toy_args(prompts_per_step=1, group_size=4))
        trajs = [
            dataclasses.replace(t, outcome=Outcome(r, Status.RESOLVED))
            for t, r in zip(trajs, [1.0, 0.0, 0.5, 0.0], strict=True)
        ]
        before = {k: v.clone() for k, v in trainer.state_dict_for_engines().items()}
        m = trainer.step(trajs)
        after = trainer.state_dict_for_engines()
        assert all(v.dtype == torch.float32 for v in after.values())
        moved = sum(int((after[k] != before[k]).sum()) for k in after)
        assert moved > 0.5 * sum(v.numel() for v in after.values())  # lr 1e-6 steps survive in fp32
        assert m["mismatch/pearson"] > 0.99  # sampled in fp32, recomputed in bf16
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_mismatch_is_over_the_tokens_the_recomputed_policy_sampled(one_thread):
    """A stale token differs from the recomputation by the policy's own updates, not by engine
    numerics: it stays out of mismatch/* (an asynchronous run would report its learning as a
    mismatch), while staleness counts it. Sampled by version 0, trained at 0 then at 1."""
    trainer = Trainer(TrainerConfig(model="tiny-qwen3", lr=3e-2, seed=0))
    trajs, _ = minimal.rollouts(trainer.lm, 0, toy_args(prompts_per_step=1, group_size=8))
    fresh = trainer.step(copy.deepcopy(trajs))
    assert fresh["mismatch/pearson"] > 0.9999 and fresh["policy/staleness_mean"] == 0
    stale = trainer.step(copy.deepcopy(trajs))  # the same tokens, now one version behind
    assert stale["policy/staleness_max"] == 1 and not any(k.startswith("mismatch/pearson") for k in stale)
