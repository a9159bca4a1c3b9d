"""Recomputed logprobs: the chunked head is exact, packing changes nothing, and the trainer
reproduces what the samplers recorded (own KV-cache sampler and the in-process hf engine)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from legorl.engine.hf import HFEngine
from legorl.train.batch import pack
from legorl.train.config import TrainerConfig
from legorl.train.logprobs import LogprobOptions, PolicyModel, chunked_logprobs
from legorl.train.routing import routing_mismatch
from legorl.train.sampler import sample
from legorl.train.trainer import load_lm
from legorl.types import AlignmentStats, Segment, Trajectory
from tests.helpers.logprob_util import engine_session, pearson

MODELS = ["tiny-qwen3", "tiny-qwen3-moe"]
pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def lms():
    return {name: load_lm(TrainerConfig(model=name)).eval() for name in MODELS}


@pytest.mark.parametrize("fp32", [True, False])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_head_matches_full_log_softmax_values_and_gradients(fp32, chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(13, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    tgt = torch.randint(0, 50, (13,), generator=g)
    up = torch.randn(13, generator=g, dtype=torch.float64)
    lp, ent = chunked_logprobs(h, w, tgt, temperature=0.7, chunk=chunk, fp32=fp32)
    (lp.double() * up).sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref_all = torch.log_softmax((h @ w.t()) / 0.7, dim=-1)
    ref = ref_all.gather(1, tgt[:, None]).squeeze(1)
    (ref * up).sum().backward()
    tol = 1e-10 if fp32 else 1e-5  # fp32=True keeps float64 inputs in float64; False rounds logits to fp32
    torch.testing.assert_close(lp.double(), ref.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(ent.double(), -(ref_all.exp() * ref_all).sum(-1).detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(gh, h.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(gw, w.grad, rtol=tol, atol=tol)
    assert not ent.requires_grad


def multi_turn_trajectory(lm, name, g, temperature):
    """Two turns with a 'tool output' between them, one segment, sampled by the reference sampler."""
    prompt = torch.randint(3, 4096, (11,), generator=g).tolist()
    s1 = sample(lm, [prompt], max_new_tokens=9, temperature=temperature, generator=g)[0]
    tool = torch.randint(3, 4096, (6,), generator=g).tolist()
    p2 = prompt + s1.completion_ids + tool
    s2 = sample(lm, [p2], max_new_tokens=7, temperature=temperature, generator=g)[0]
    ids = p2 + s2.completion_ids
    mask = [0] * len(prompt) + [1] * len(s1.completion_ids) + [0] * len(tool) + [1] * len(s2.completion_ids)
    lps = [0.0] * len(prompt) + s1.logprobs + [0.0] * len(tool) + s2.logprobs
    seg = Segment([0, 1], ids, mask, lps, [0, 0], s2.routed_experts)
    return Trajectory(name, [seg], AlignmentStats(), instance_id="task")


@pytest.mark.parametrize("name", MODELS)
def test_recompute_matches_own_kv_cache_sampler(lms, name):
    lm = lms[name]
    g = torch.Generator().manual_seed(1)
    trajs = [multi_turn_trajectory(lm, f"s{i}", g, 0.7) for i in range(3)]
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 10_000)
    policy = PolicyModel(lm)
    outs = {}
    with torch.no_grad():
        for packing in ("packed", "per_segment"):
            outs[packing] = policy(mb, LogprobOptions(temperature=0.7, packing=packing, chunk=7))
    sel = mb.mask_N > 0
    lp = outs["packed"].logprobs_N[sel]
    torch.testing.assert_close(lp, outs["per_segment"].logprobs_N[sel], rtol=0, atol=2e-5)
    assert pearson(lp.exp(), mb.rollout_logprobs_N[sel].exp()) >= 0.9999
    assert float((lp - mb.rollout_logprobs_N[sel]).abs().max()) < 1e-4
    if name.endswith("moe"):
        valid = (mb.replay_N_L_K >= 0).all(-1).all(-1)
        assert routing_mismatch(outs["packed"].used_N_L_K, mb.replay_N_L_K, valid) == (0, int(valid.sum()) * 4)


@pytest.mark.parametrize("attn", ["legorl_varlen", "sdpa"])
def test_packed_segments_do_not_attend_to_each_other(lms, attn):
    """Changing one segment's tokens leaves the other segment's logprobs unchanged, with the
    per-segment varlen attention and with sdpa's block-diagonal mask alike."""
    lm = (
        lms["tiny-qwen3"]
        if attn == "legorl_varlen"
        else load_lm(TrainerConfig(model="tiny-qwen3", attn_implementation=attn))
    )
    assert lm.config._attn_implementation == attn
    a = Segment([0], list(range(5, 25)), [0] * 10 + [1] * 10, [0.0] * 20, [0])
    b = Segment([0], list(range(100, 130)), [0] * 10 + [1] * 20, [0.0] * 30, [0])
    b2 = Segment([0], list(range(200, 230)), [0] * 10 + [1] * 20, [0.0] * 30, [0])
    opts = LogprobOptions(packing="packed")
    policy = PolicyModel(lm)
    with torch.no_grad():
        out1 = policy(
            pack([(0, Trajectory("x", [b, a], AlignmentStats(), instance_id="t"), 1.0)], "segment", 100)[0], opts
        )
        out2 = policy(
            pack([(0, Trajectory("x", [b2, a], AlignmentStats(), instance_id="t"), 1.0)], "segment", 100)[0], opts
        )
        alone = policy(
            pack([(0, Trajectory("x", [a], AlignmentStats(), instance_id="t"), 1.0)], "segment", 100)[0], opts
        )
    torch.testing.assert_close(out1.logprobs_N[30:], out2.logprobs_N[30:], rtol=0, atol=1e-6)
    torch.testing.assert_close(out1.logprobs_N[30:], alone.logprobs_N, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
async def test_recompute_matches_hf_engine(lms, name):
    """Concurrent sessions (left-padded batches in the engine) vs the trainer's packed forward."""
    engine = HFEngine(name, device="cpu", dtype="float32", seed=3)
    try:
        g = torch.Generator().manual_seed(2)
        trajs = await asyncio.gather(*(engine_session(engine, g, f"sess{i}", 0.8) for i in range(3)))
    finally:
        await engine.close()
    trajs = [dataclasses.replace(t, instance_id="task") for t in trajs]
    for t in trajs:
        assert len(t.segments) == 1  # each prompt extended the previous prompt + completion
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 10_000)
    with torch.no_grad():
        out = PolicyModel(lms[name])(mb, LogprobOptions(temperature=0.8))
    sel = mb.mask_N > 0
    assert int(sel.sum()) >= 30
    assert pearson(out.logprobs_N[sel].exp(), mb.rollout_logprobs_N[sel].exp()) >= 0.9999
    assert float((out.logprobs_N[sel] - mb.rollout_logprobs_N[sel]).abs().max()) < 1e-3
    if name.endswith("moe"):
        assert mb.replay_N_L_K is not None and bool((mb.replay_N_L_K >= 0).all())
        assert routing_mismatch(out.used_N_L_K, mb.replay_N_L_K, torch.ones(mb.num_tokens, dtype=torch.bool))[0] == 0


def test_sampler_uses_the_cache_keyword_the_decoder_takes(lms, monkeypatch):
    """transformers renamed forward(past_key_values=) to cache=; a decoder of the older
    name must get its KV cache too (5.17 silently dropped an unknown `cache=`, and every
    decoding step then ran without its prefix)."""
    from legorl.engine.kv_batch import cache_kwarg

    lm = lms["tiny-qwen3"]
    real = lm.get_decoder()

    class OldKeywordDecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = real

        def forward(self, input_ids, position_ids, past_key_values=None, use_cache=False):
            return self.inner(
                input_ids=input_ids,
                position_ids=position_ids,
                use_cache=use_cache,
                **{cache_kwarg(self.inner): past_key_values},
            )

    prompt = list(range(5, 17))
    want = sample(lm, [prompt], max_new_tokens=6, temperature=0.8, generator=torch.Generator().manual_seed(3))[0]
    monkeypatch.setattr(lm, "get_decoder", lambda: OldKeywordDecoder())
    got = sample(lm, [prompt], max_new_tokens=6, temperature=0.8, generator=torch.Generator().manual_seed(3))[0]
    assert got.completion_ids == want.completion_ids
    torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs))
