"""The completion-token cap of a turn comes from the run config: `[proxy] max_tokens`.

A pretrained model that never emits its end token samples until the cap (SmolLM2 through
mini-swe-agent once sampled 4,096 tokens of babble in one turn, the harness's own default).
So the default cap is modest, a config raises it, and a harness's request can only lower it.
"""

from __future__ import annotations

import openai

from legorl.engine.scripted import ScriptedEngine
from legorl.loop.config import RunConfig
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from tests.helpers.proxy_util import SpyEngine, tokenizer

BABBLE = " ".join(["word"] * 3000)  # a completion longer than any cap below


def test_default_cap_is_modest_and_the_run_config_raises_it() -> None:
    assert ProxyConfig().max_tokens == 1024
    assert RunConfig.model_validate({}).proxy.max_tokens == 1024
    assert RunConfig.model_validate({"proxy": {"max_tokens": 8192}}).proxy.max_tokens == 8192


async def test_harness_request_only_lowers_the_configured_cap() -> None:
    engine = SpyEngine(ScriptedEngine([BABBLE] * 3, tokenizer()))
    async with ProxyServer(
        ProxyConfig(port=0, max_tokens=40), engine, ChatMLRenderer(tokenizer()), standalone=True
    ) as srv:
        o = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key="k", max_retries=0)
        msgs = [{"role": "user", "content": "x"}]
        none = await o.chat.completions.create(model="m", messages=msgs)
        higher = await o.chat.completions.create(model="m", messages=msgs, max_tokens=4096)
        lower = await o.chat.completions.create(model="m", messages=msgs, max_tokens=7)
    assert [c.params.max_tokens for c in engine.calls] == [40, 40, 7]
    assert [r.usage.completion_tokens for r in (none, higher, lower)] == [40, 40, 7]
    assert all(r.choices[0].finish_reason == "length" for r in (none, higher, lower))
