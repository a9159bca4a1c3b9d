"""The `hf` engine on each supported architecture family: hybrid linear/full attention
(Qwen3.5, dense and MoE), sliding-window attention with sinks (gpt-oss, eager) and without
(Qwen3 with a windowed first layer, sdpa), grouped
routers with shared experts (GLM-4.5, DeepSeek-V3). Batched, left-padded, chunk-prefilled
and regrouped generations must equal a fresh unpadded forward: logprobs and routing."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
import torch

from legorl.engine.hf import HFEngine
from legorl.engine.routing import routed_experts
from legorl.engine.sampling import token_logprobs
from legorl.model_families import save
from legorl.types import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread_per_module")

MOE = {"qwen3_5_moe": 4, "gpt_oss": 2, "glm4_moe": 2, "deepseek_v3": 2, "qwen2_moe": 2}  # family → MoE layers
# lengths around gpt-oss's window (8) and the prefill chunk (5), and one shorter than the conv kernel (4)
PROMPTS = [torch.randint(3, 4096, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 17, 3, 30)]


@pytest.mark.parametrize(
    "family", ["qwen3_5_moe", "qwen3_5", "gpt_oss", "qwen3_windowed", "glm4_moe", "deepseek_v3", "qwen2_moe"]
)
async def test_batched_generation_equals_a_fresh_forward(family: str, tmp_path) -> None:
    path = save(family.removesuffix("_windowed"), tmp_path / family)
    if family == "qwen3_windowed":  # a windowed first layer (8 tokens back), then full attention
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(use_sliding_window=True, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
        (path / "config.json").write_text(json.dumps(cfg))
    engine = HFEngine(str(path), seed=0, prefill_chunk=5)
    try:
        with torch.no_grad():  # padding is id 0: make it a real embedding, so a leak would show
            engine.model.get_input_embeddings().weight[0].normal_(generator=torch.Generator().manual_seed(0))
        if family == "gpt_oss":
            assert engine.model.config._attn_implementation == "eager"  # no sdpa with sinks
        params = SamplingParams(temperature=1.0, max_tokens=16, seed=3)

        async def late(prompt: list[int], delay: float):
            await asyncio.sleep(delay)  # joins a running batch: a regroup
            return await engine.generate(prompt, params)

        prompts = PROMPTS + PROMPTS[:2]  # rows leave at 4, 8, 12, 16 tokens: regroups
        gens = await asyncio.gather(
            *[engine.generate(p, dataclasses.replace(params, max_tokens=4 + 4 * i)) for i, p in enumerate(PROMPTS)],
            late(PROMPTS[0], 0.05),
            late(PROMPTS[1], 0.1),
        )
        for prompt, g in zip(prompts, gens, strict=True):
            ids = prompt + g.completion_ids
            with torch.no_grad():
                logits_T_V = engine.model(input_ids=torch.tensor([ids])).logits[0]
            want = token_logprobs(logits_T_V[len(prompt) - 1 : -1], torch.tensor(g.completion_ids), params)
            assert float((torch.tensor(g.logprobs) - want).abs().max()) < 1e-4
            if family in MOE:
                assert g.routed_experts is not None and g.routed_experts.shape == (len(ids), MOE[family], 2)
                assert g.routed_experts.tolist() == routed_experts(engine.model, ids).tolist()
            else:
                assert g.routed_experts is None
    finally:
        await engine.close()


def _all_windowed(path, window: int = 8):  # type: ignore[no-untyped-def]
    """A Qwen3 directory whose every layer is a sliding-window layer (`window` tokens back)."""
    cfg = json.loads((path / "config.json").read_text())
    layers = ["sliding_attention"] * cfg["num_hidden_layers"]
    cfg.update(use_sliding_window=True, sliding_window=window, max_window_layers=0, layer_types=layers)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


async def test_every_layer_windowed_keeps_only_the_window_and_equals_a_fresh_forward(tmp_path, monkeypatch) -> None:
    """Qwen3 with every layer windowed (8 back): the batch keeps each row's last 8 columns (cut at
    every regroup, and once decode has grown it to 16), a reused prefix is copied in as its last 8
    columns. Prompts many windows long, sessions joining mid-decode and later turns reusing the
    first turn's stored prompt still give exactly a fresh forward's logprobs: positions stay
    absolute."""
    engine = HFEngine(str(_all_windowed(save("qwen3", tmp_path / "q"))), seed=0, prefill_chunk=16)
    assert engine._fwd.keep == 8
    widths: list[int] = []  # columns of every decode forward
    decode = engine._fwd.decode

    def spy(batch, tokens_B, positions_B):  # type: ignore[no-untyped-def]
        widths.append(batch.valid_B_S.shape[1] + 1)
        return decode(batch, tokens_B, positions_B)

    monkeypatch.setattr(engine._fwd, "decode", spy)
    gen = torch.Generator().manual_seed(7)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 4096, (n,), generator=gen).tolist()

    system = ids(60)  # shared by every session: stored at the first prefill, reused by the rest
    done: list[tuple[list[int], object]] = []
    try:
        with torch.no_grad():  # padding is id 0: make it a real embedding, so a leak would show
            engine.model.get_input_embeddings().weight[0].normal_(generator=torch.Generator().manual_seed(0))

        async def session(i: int) -> None:
            await asyncio.sleep(0.04 * i)  # later sessions join a running batch
            prompt = system + ids(5 + 7 * i)
            for turn in range(3):
                params = SamplingParams(temperature=1.0, max_tokens=3 + 5 * i + turn, seed=10 * i + turn)
                g = await engine.generate(prompt, params)
                done.append((prompt, g))
                prompt = prompt + list(g.completion_ids) + ids(11)

        await asyncio.gather(*[session(i) for i in range(5)])
        params = SamplingParams(temperature=1.0)
        for prompt, g in done:
            full = prompt + list(g.completion_ids)  # type: ignore[attr-defined]
            with torch.no_grad():
                logits_T_V = engine.model(input_ids=torch.tensor([full])).logits[0]
            want = token_logprobs(logits_T_V[len(prompt) - 1 : -1], torch.tensor(g.completion_ids), params)  # type: ignore[attr-defined]
            assert float((torch.tensor(g.logprobs) - want).abs().max()) < 1e-4  # type: ignore[attr-defined]
        assert max(len(p) for p, _ in done) > 10 * 8  # prompts many windows long
        assert widths and max(widths) <= 2 * 8  # the batch never held more than twice the window
        assert engine.stats["reused_tokens"] > 0
    finally:
        await engine.close()


async def test_every_layer_windowed_a_turn_reuses_the_whole_last_prompt_even_one_that_reused(tmp_path) -> None:
    """Session B's first prompt reuses the system prompt session A stored, and is cut to its
    window at once; its second turn still reuses B's whole first prompt (the reused columns
    joined to B's own), not only the system prompt, and samples what a fresh forward does."""
    engine = HFEngine(str(_all_windowed(save("qwen3", tmp_path / "q"))), seed=0, prefill_chunk=16)
    gen = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 4096, (n,), generator=gen).tolist()

    system = ids(70)
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=1)
    try:
        await engine.generate(system + ids(9), params)  # session A: stores the system prompt
        first = system + ids(13)  # session B, turn 1: reuses A's 70 + ... columns
        before = engine.stats["reused_tokens"]
        g1 = await engine.generate(first, params)
        assert 70 <= engine.stats["reused_tokens"] - before < len(first)
        second = first + list(g1.completion_ids) + ids(11)  # turn 2: B's transcript
        before = engine.stats["reused_tokens"]
        g2 = await engine.generate(second, params)
        assert engine.stats["reused_tokens"] - before == len(first)  # all of turn 1's prompt
        for prompt, g in ((first, g1), (second, g2)):
            with torch.no_grad():
                logits_T_V = engine.model(input_ids=torch.tensor([prompt + list(g.completion_ids)])).logits[0]
            want = token_logprobs(logits_T_V[len(prompt) - 1 : -1], torch.tensor(g.completion_ids), params)
            assert float((torch.tensor(g.logprobs) - want).abs().max()) < 1e-4
    finally:
        await engine.close()


@pytest.mark.parametrize("family", ["qwen3_windowed", "gpt_oss"])
def test_a_full_attention_layer_keeps_every_column(family: str, tmp_path) -> None:
    """One full-attention layer sees the whole row: nothing is cut."""
    from legorl.engine.kv_batch import BatchedForward

    path = save(family.removesuffix("_windowed"), tmp_path / family)
    if family == "qwen3_windowed":
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(use_sliding_window=True, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
        (path / "config.json").write_text(json.dumps(cfg))
    from legorl.engine.hf import load_model

    assert BatchedForward(load_model(str(path), "cpu", "float32", "eager")).keep is None
