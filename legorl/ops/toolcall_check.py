"""Pre-flight: a tool call the model writes comes back to the harness as a tool call.

Why: a proxy whose tool-call parser never matches the model's format (`[proxy] tool_format`
set to another family, a template the parser does not know) returns every call as plain
text. Nothing fails: the harness sees prose, the policy is graded on runs without a single
tool call, and a reward can even look fine (agentcore-rl-toolkit#97 "validated" at 0.93). So
the check writes one call the way the model's own chat template writes it (the text an
assistant turn holding `bash {"command": "ls"}` renders to), has the proxy serve exactly
those tokens (a scripted engine behind a real proxy on loopback) to a request in each
configured harness's dialect, and counts the calls in the dialect's response. Zero is fatal.
A harness that acts through text blocks (mini-swe-agent's text-based agent) reads no tool
calls and passes with its format named, as does `command` (the script's calls are its own);
a `[proxy] max_tokens` too small to hold one call is fatal too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from legorl.loop.config import RunConfig
from legorl.monitor.doctor import CheckFailed, check
from legorl.types import Dialect

CALL = {"name": "bash", "arguments": {"command": "ls"}}
ASK = "List the files."
# the dialect each harness speaks to its session (its adapter's launch: which base URL it is given)
DIALECTS: dict[str, Dialect] = {
    "claude-code": Dialect.ANTHROPIC,
    "codex": Dialect.RESPONSES,
    "gemini-cli": Dialect.GEMINI,
}


def dialect_of(harness: str, options: dict[str, Any]) -> Dialect:
    """The API dialect `harness` speaks (Pi's is its `api` option); OpenAI chat otherwise."""
    if harness == "pi" and options.get("api") == "anthropic-messages":
        return Dialect.ANTHROPIC
    return DIALECTS.get(harness, Dialect.OPENAI_CHAT)


def template_call_text(tok: Any, eos_texts: list[str]) -> str:
    """The assistant turn holding `CALL`, as the model's chat template renders it, up to its
    end-of-turn token (what a model trained on the template generates)."""
    from legorl.proxy.renderer_choice import PROBE_TOOLS

    msgs = [{"role": "user", "content": ASK}]
    reply = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": CALL}]}
    prompt = tok.apply_chat_template(msgs, tools=PROBE_TOOLS, add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template([*msgs, reply], tools=PROBE_TOOLS, tokenize=False)
    k = 0
    while k < min(len(prompt), len(full)) and prompt[k] == full[k]:
        k += 1
    text = full[k:]
    cuts = [i for e in eos_texts if e and (i := text.find(e)) >= 0]
    return text[: min(cuts)] if cuts else text


def _request(dialect: Dialect) -> tuple[str, dict[str, Any]]:
    """Path (under the session) and body of one request offering the `bash` tool."""
    schema = {"type": "object", "properties": {"command": {"type": "string"}}}
    desc = "Run a shell command."
    if dialect is Dialect.ANTHROPIC:
        tools: Any = [{"name": "bash", "description": desc, "input_schema": schema}]
        return "/v1/messages", {
            "model": "m",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": ASK}],
            "tools": tools,
        }
    if dialect is Dialect.RESPONSES:
        tools = [{"type": "function", "name": "bash", "description": desc, "parameters": schema}]
        return "/v1/responses", {"model": "m", "input": ASK, "tools": tools}
    if dialect is Dialect.GEMINI:
        tools = [{"functionDeclarations": [{"name": "bash", "description": desc, "parameters": schema}]}]
        return "/v1beta/models/m:generateContent", {
            "contents": [{"role": "user", "parts": [{"text": ASK}]}],
            "tools": tools,
        }
    tools = [{"type": "function", "function": {"name": "bash", "description": desc, "parameters": schema}}]
    return "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": ASK}], "tools": tools}


def calls_in(dialect: Dialect, body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, arguments) of every tool call in a response of `dialect`."""
    if dialect is Dialect.ANTHROPIC:
        return [(b["name"], b.get("input")) for b in body.get("content", []) if b.get("type") == "tool_use"]
    if dialect is Dialect.RESPONSES:
        return [
            (o["name"], json.loads(o.get("arguments") or "null"))
            for o in body.get("output", [])
            if o.get("type") == "function_call"
        ]
    if dialect is Dialect.GEMINI:
        parts = [p for c in body.get("candidates", []) for p in c.get("content", {}).get("parts", [])]
        return [(p["functionCall"]["name"], p["functionCall"].get("args")) for p in parts if "functionCall" in p]
    msg = (body.get("choices") or [{}])[0].get("message", {})
    return [
        (c["function"]["name"], json.loads(c["function"].get("arguments") or "null"))
        for c in msg.get("tool_calls") or []
    ]


async def round_trip(cfg: RunConfig, tok: Any, renderer: Any, completion_ids: list[int], dialect: Dialect) -> list:
    """The tool calls a harness speaking `dialect` receives when the model writes
    `completion_ids`: through the proxy itself (its parser, its dialect's encoder) on loopback."""
    import httpx

    from legorl.engine.scripted import ScriptedEngine
    from legorl.proxy.server import ProxyServer

    proxy = ProxyServer(
        cfg.proxy.model_copy(update={"host": "127.0.0.1", "port": 0}), ScriptedEngine([completion_ids], tok), renderer
    )
    async with proxy:
        proxy.open_session("doctor")
        try:
            async with httpx.AsyncClient(base_url=proxy.session_url("doctor"), timeout=60) as client:
                path, body = _request(dialect)
                r = await client.post(path, json=body)
        finally:
            proxy.close_session("doctor")
    if r.status_code != 200:
        raise CheckFailed(f"the proxy answered {r.status_code} to a {dialect.value} request: {r.text[:300]}")
    return calls_in(dialect, r.json())


@check("tool calls round-trip", timeout=120)
def toolcall_check(cfg: RunConfig) -> str:
    """`tool calls round-trip`: fatal when a configured harness receives no call."""
    from legorl.harness.registry import COMMAND, action_format
    from legorl.models import load_tokenizer
    from legorl.proxy.renderer_choice import make_renderer
    from legorl.proxy.template import TemplateError

    tok = load_tokenizer(cfg.engine.model)
    try:
        renderer = make_renderer(tok)
    except TemplateError as e:
        raise CheckFailed(str(e), fix="serve a model whose chat template is a supported family") from None
    fmt = renderer.tool_format if cfg.proxy.tool_format == "auto" else cfg.proxy.tool_format
    eos = sorted(renderer.eos_ids)
    text = template_call_text(tok, [tok.decode([i], skip_special_tokens=False) for i in eos])
    ids = tok.encode(text, add_special_tokens=False) + eos[:1]
    found: list[str] = []
    for name in cfg.harness.names():
        if name == COMMAND:
            found.append("command: the script's calls are its own")
            continue
        if len(ids) > cfg.proxy.max_tokens:
            raise CheckFailed(
                f"[proxy] max_tokens = {cfg.proxy.max_tokens} cannot hold one tool call: {name} would never "
                f"receive one (the model's template writes it in {len(ids)} tokens)",
                fix="raise [proxy] max_tokens",
            )
        options = cfg.harness.harness_options(cfg.proxy.served_model)
        acts = action_format(name, **options)
        if acts.kind != "tool_calls":
            found.append(f"{name}: acts through {acts.label}, not tool calls")
            continue
        dialect = dialect_of(name, cfg.harness.options)
        calls = asyncio.run(round_trip(cfg, tok, renderer, ids, dialect))
        if not any(n == CALL["name"] and a == CALL["arguments"] for n, a in calls):
            raise CheckFailed(
                f"0 of 1 tool calls came back to {name} ({dialect.value}): the model's template writes "
                f"{text.strip()[:120]!r}, the proxy parses {fmt!r} and returned {calls or 'none'}",
                fix=f"set [proxy] tool_format to the model's family (now {cfg.proxy.tool_format!r}; 'auto' "
                "takes the template's) or serve a model whose template the proxy knows",
            )
        found.append(f"{name}: 1 of 1 ({dialect.value})")
    return f"{fmt} tool calls; " + "; ".join(found)
