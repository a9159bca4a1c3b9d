"""`legorl doctor`'s proxy check: our incremental renderer equals the model's own chat template,
and render → generate → parse → render-next-turn keeps the recorded ids an exact prefix (what
makes trajectories one segment).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from legorl.monitor.doctor import CheckFailed, check
from legorl.types import SamplingParams

if TYPE_CHECKING:
    from legorl.loop.config import RunConfig


@check("chat template round trip", needs=("engine answers",), timeout=120)
def template_check(cfg: RunConfig) -> str:
    from legorl.engine.registry import make_engine
    from legorl.models import load_tokenizer
    from legorl.proxy.renderer import ChatRequest, RenderState
    from legorl.proxy.renderer_choice import PROBE_TOOLS, make_renderer, round_trip
    from legorl.proxy.template import TemplateError
    from legorl.proxy.toolcalls import parse_completion

    tok = load_tokenizer(cfg.engine.model)
    try:
        r = make_renderer(tok)
        parity = round_trip(tok)
    except TemplateError as e:
        raise CheckFailed(
            str(e),
            fix="serve a model whose chat template is one of the supported families "
            "(Qwen2.5/Qwen3/Qwen3.5/Qwen3-Coder, gpt-oss, GLM-4.5, ChatML without tools)",
        ) from None
    tools = PROBE_TOOLS
    msgs = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "List the files."}]
    state = RenderState()
    prompt = r.render(ChatRequest(msgs, tools), state)

    async def go() -> Any:
        engine = make_engine(cfg.engine, tok)
        try:
            return await asyncio.wait_for(engine.generate(prompt, SamplingParams(max_tokens=24, seed=0)), 60)
        finally:
            await engine.close()

    gen = asyncio.run(go())
    text = r.decode([i for i in gen.completion_ids if i not in r.eos_ids])
    parsed = parse_completion(text, r.tool_format, getattr(r, "starts_in_reasoning", False))
    state.remember(gen.completion_ids, parsed, prompt)
    reply: dict[str, Any] = {"role": "assistant", "content": parsed.content, "reasoning_content": parsed.reasoning}
    if parsed.tool_calls:
        reply["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ]
    nxt = msgs + [reply, {"role": "user", "content": "Go on."}]
    again = r.render(ChatRequest(nxt, tools), state)
    if again[: len(prompt) + len(gen.completion_ids)] == prompt + gen.completion_ids:
        return f"{parity}; next turn extends {len(prompt) + len(gen.completion_ids)} ids"
    if again == r.render(ChatRequest(nxt, tools)):
        return f"{parity}; the template rewrites the reply in history: a new segment (the documented rule)"
    raise CheckFailed(
        "the next turn's prompt neither extends prompt + completion nor equals the template's rendering",
        fix="report a bug: the renderer's splicing lost the sampled ids",
    )
