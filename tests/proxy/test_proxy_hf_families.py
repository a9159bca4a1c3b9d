"""The proxy serves each architecture family through the real `hf` engine: concurrent
sessions (batched in the engine), turns recorded with routing for MoE families, and the
assembled trajectory's routing covering every token (what the trainer replays)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from legorl.engine.hf import HFEngine
from legorl.model_families import save
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.trajectory import assemble
from tests.helpers.proxy_util import tokenizer

pytestmark = pytest.mark.usefixtures("one_thread_per_module")
MOE_LAYERS = {"qwen3_5_moe": 4, "gpt_oss": 2, "glm4_moe": 2, "qwen3_5": None}


@pytest.mark.parametrize("family", list(MOE_LAYERS))
async def test_proxy_serves_the_family_and_records_routing(family: str, tmp_path) -> None:
    engine = HFEngine(str(save(family, tmp_path / family)), tokenizer(), seed=0, num_threads=1)
    try:
        async with ProxyServer(
            ProxyConfig(port=0, max_tokens=12), engine, ChatMLRenderer(tokenizer()), standalone=True
        ) as srv:

            async def session(sid: str) -> None:
                o = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key=sid, max_retries=0)
                msgs = [{"role": "user", "content": f"fix the bug in {sid}.py"}]
                for _ in range(2):
                    r = await o.chat.completions.create(model="p", messages=msgs)
                    msgs += [
                        {"role": "assistant", "content": r.choices[0].message.content or ""},
                        {"role": "user", "content": "and the tests?"},
                    ]

            sids = [f"{family}-{i}" for i in range(3)]
            await asyncio.gather(*(session(s) for s in sids))
            for sid in sids:
                turns = srv.close_session(sid)
                assert len(turns) == 2
                for turn in turns:
                    if MOE_LAYERS[family] is None:
                        assert turn.routed_experts is None
                    else:
                        assert turn.routed_experts is not None
                        assert turn.routed_experts.shape[1:] == (MOE_LAYERS[family], 2)
                traj = assemble(turns)
                if MOE_LAYERS[family] is not None:
                    for seg in traj.segments:
                        assert len(seg.routed_experts) == len(seg.token_ids)
    finally:
        await engine.close()
