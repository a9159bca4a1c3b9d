"""Packed recompute equals per-segment recompute for every verified (family, attention kernel),
and the trainer refuses packing for anything else.

This module is what verifies `legorl.packed_families.VERIFIED`: it parametrises over that
registry, so an entry cannot be added without passing here. The trajectories are sampled by
the reference sampler (routing recorded and replayed), four of them of different lengths in
one row, shorter and longer than gpt-oss's sliding window.

Why a tolerance and not bitwise equality: the two forwards reduce over different lengths.
An expert gets the tokens routed to it from the whole row or from one segment, and CPU GEMM
kernels choose their blocking, hence their summation order, by row count (with one thread,
rows [0, m) of an (n × 64) @ (64 × 64) product differ in the last bit from the (m × 64)
product whenever m < 4 ≤ n); and a mask-based kernel (sdpa, eager) attends over all of the
row's keys, the other segments' masked to zero weight, so its sums are blocked differently
than over one segment's keys. Measured over every case here: logprobs 0 (bitwise) or 9.5e-7,
one ulp of a logprob near −8; entropies (a sum over the 4096-token vocabulary) up to 4.8e-6,
five ulp of ~8.3. Checked at 4e-6 + 1e-6 × |value| (~13 ulp); a row whose segments attend to
each other is off by 0.1 to 0.3.
"""

from __future__ import annotations

import json

import pytest
import torch

from legorl.config import ConfigError
from legorl.model_families import FAMILIES, build
from legorl.models import BUNDLED
from legorl.packed_families import VERIFIED, packing_refusal
from legorl.train import varlen
from legorl.train.batch import pack
from legorl.train.config import TrainerConfig
from legorl.train.logprobs import LogprobOptions, PolicyModel
from legorl.train.sampler import sample
from legorl.types import AlignmentStats, Segment, Trajectory

pytestmark = pytest.mark.usefixtures("one_thread_per_module")

CASES = [(model_type, attn) for model_type, entry in VERIFIED.items() for attn in entry.attention]
SHAPES = [(3, 3), (12, 9), (5, 4), (20, 10)]  # prompt + completion tokens: 6, 21, 9, 30


def sampled(lm, g: torch.Generator, prompt_len: int, new_tokens: int, name: str) -> Trajectory:
    prompt = torch.randint(3, 4096, (prompt_len,), generator=g).tolist()
    s = sample(lm, [prompt], max_new_tokens=new_tokens, temperature=1.0, generator=g)[0]
    n = len(s.completion_ids)
    seg = Segment([0], prompt + s.completion_ids, [0] * prompt_len + [1] * n, [0.0] * prompt_len + s.logprobs, [0])
    seg.routed_experts = s.routed_experts
    return Trajectory(name, [seg], AlignmentStats(), instance_id="task")


def tiny(model_type: str, attn: str):
    lm = build(VERIFIED[model_type].family)
    lm.set_attn_implementation(varlen.register() if attn == "legorl_varlen" else attn)
    assert lm.config.model_type == model_type and lm.config._attn_implementation == attn
    return lm


@pytest.mark.parametrize(("model_type", "attn"), CASES)
def test_packed_equals_per_segment(model_type: str, attn: str) -> None:
    lm = tiny(model_type, attn)
    g = torch.Generator().manual_seed(0)
    trajs = [sampled(lm, g, p, c, f"s{i}") for i, (p, c) in enumerate(SHAPES)]
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 10_000)
    assert len(set(mb.segment_lengths)) == len(SHAPES)  # four trajectories of four lengths in one row
    if "sliding_attention" in (getattr(lm.config, "layer_types", None) or []):
        assert min(mb.segment_lengths) < lm.config.sliding_window < max(mb.segment_lengths)
    policy = PolicyModel(lm)
    with torch.no_grad():
        packed, alone = (policy(mb, LogprobOptions(packing=p)) for p in ("packed", "per_segment"))
    sel = mb.mask_N > 0
    torch.testing.assert_close(packed.logprobs_N, alone.logprobs_N, rtol=1e-6, atol=4e-6)
    torch.testing.assert_close(packed.entropy_N, alone.entropy_N, rtol=1e-6, atol=4e-6)
    # and both are what the sampler recorded (the recompute is right, not merely consistent)
    torch.testing.assert_close(packed.logprobs_N[sel], mb.rollout_logprobs_N[sel], rtol=0, atol=1e-4)
    if policy.is_moe:
        assert torch.equal(packed.used_N_L_K, alone.used_N_L_K)


@pytest.mark.parametrize(
    ("model_type", "attn"), [(t, a) for t, a in CASES if VERIFIED[t].own_masks and a in ("eager", "sdpa")]
)
def test_gradients_equal_where_the_policy_builds_the_masks(model_type: str, attn: str) -> None:
    """The masks PolicyModel builds (and the embeddings it computes for them) carry the same
    gradient as per-segment forwards, embeddings included."""
    lm = tiny(model_type, attn)
    g = torch.Generator().manual_seed(1)
    trajs = [sampled(lm, g, p, c, f"s{i}") for i, (p, c) in enumerate(SHAPES)]
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 10_000)
    policy = PolicyModel(lm.train())
    grads = []
    for packing in ("packed", "per_segment"):
        policy.zero_grad()
        policy(mb, LogprobOptions(packing=packing)).logprobs_N.sum().backward()
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and "lm.model.embed_tokens.weight" in grads[0]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-5, atol=1e-5, msg=name)


def test_the_registry_covers_every_family_and_bundled_model() -> None:
    """The list the trainer trusts and the list the test above checks are one: every tiny family
    verifies an entry, and every bundled model's architecture has one."""
    assert sorted(e.family for e in VERIFIED.values()) == sorted(FAMILIES)
    for name, path in BUNDLED.items():
        model_type = json.loads((path / "config.json").read_text())["model_type"]
        assert model_type in VERIFIED, name


def unverified_lm():
    """A tiny Mistral: an architecture LEGO-RL has not checked under packing."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "mistral",
        vocab_size=4096,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    return AutoModelForCausalLM.from_config(cfg)


def test_trainer_refuses_packing_for_an_unverified_family_in_one_line(tmp_path) -> None:
    from legorl.train.trainer import Trainer

    cfg = TrainerConfig(model="unused", checkpoint_dir=str(tmp_path))
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, lm=unverified_lm())
    msg = str(e.value)
    assert "\n" not in msg and "'mistral'" in msg and "per_segment" in msg and msg.startswith("[trainer] packing")
    Trainer(cfg.model_copy(update={"packing": "per_segment"}), lm=unverified_lm())  # the way out works


def test_policy_refuses_packed_rows_of_an_unverified_kernel() -> None:
    lm = build("gpt_oss")
    lm.config._attn_implementation = "flex_attention"  # not checked here: refused, not guessed
    why = packing_refusal(lm)
    assert why is not None and "'flex_attention'" in why and "legorl_varlen, eager" in why
    segs = [Segment([0], list(range(5, 5 + n)), [0] * 3 + [1] * (n - 3), [0.0] * n, [0]) for n in (6, 9)]
    (mb,) = pack([(0, Trajectory("x", segs, AlignmentStats(), instance_id="t"), 1.0)], "segment", 100)
    with pytest.raises(ValueError, match="flex_attention"):
        PolicyModel(lm)(mb, LogprobOptions(packing="packed", routing_replay=False))
