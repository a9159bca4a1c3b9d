"""A model whose chat template cannot render the harness's request: one clear error naming
the model and the construct the template refused (a system message, two messages of one
role, ...). A construct every harness sends (a system prompt) is refused when the renderer
is built, before any rollout; one only some requests carry gets the proxy's 400 saying so."""

from __future__ import annotations

import httpx
import pytest

from legorl.engine.scripted import ScriptedEngine
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.proxy.template import TemplateError, TemplateRenderer
from tests.helpers.proxy_util import tokenizer

TURN = "{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' }}"
GEN = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
# ChatML that refuses a system role (Gemma's templates do) ...
NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}" + TURN + "{% endfor %}" + GEN
)
# ... and ChatML that refuses two user messages in a row (Mistral's and Llama 2's do)
ALTERNATE = (
    "{% for m in messages %}{% if loop.index0 > 0 and m['role'] == 'user' and messages[loop.index0 - 1]['role'] "
    "== 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
    + TURN
    + "{% endfor %}"
    + GEN
)


def test_a_template_refusing_system_messages_is_refused_up_front() -> None:
    with pytest.raises(TemplateError) as e:
        TemplateRenderer(tokenizer(), chat_template=NO_SYSTEM)
    msg = str(e.value)
    assert msg.startswith("model 'tiny-qwen3': its chat template cannot render a 'system' message"), msg
    assert "System role not supported" in msg and "\n" not in msg


async def test_a_refused_request_gets_one_400_naming_model_and_construct() -> None:
    tok = tokenizer()
    engine = ScriptedEngine(["ok"], tok)
    renderer = TemplateRenderer(tok, chat_template=ALTERNATE)
    async with ProxyServer(ProxyConfig(port=0), engine, renderer, standalone=True) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, headers={"authorization": "Bearer k"}) as c:
            one = [{"role": "user", "content": "x"}]
            ok = await c.post("/v1/chat/completions", json={"model": "m", "messages": one})
            two = [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]
            r = await c.post("/v1/chat/completions", json={"model": "m", "messages": two})
    assert ok.status_code == 200
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert msg.startswith(
        "model 'tiny-qwen3': its chat template cannot render two consecutive messages of the same role"
    )
    assert "roles must alternate" in msg and "\n" not in msg
