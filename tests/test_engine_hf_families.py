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
