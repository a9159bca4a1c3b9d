"""OpenAI Chat Completions (`POST /v1/chat/completions`): OpenCode, OpenHands, mini-swe-agent.

Request: system/developer/user/assistant/tool messages whose content is a string, null or
a list of parts (text; images become a placeholder, audio is refused), assistant
`tool_calls` and `reasoning_content`, a trailing assistant message as a prefill (OpenCode's
step limit), `stop`, `max_tokens`/`max_completion_tokens`. Everything else
(`reasoning_effort`, `prompt_cache_key`, `tool_choice`, `stream_options`, ...) is
accepted; sampling fields are recorded, not obeyed (see `config.py`).

Response: `chat.completion` JSON, or SSE chunks — role chunk, `content` /
`reasoning_content` deltas, `tool_calls` deltas by index (the first one of a call carries
id and name), a finish chunk, a usage chunk when `stream_options.include_usage`, and
`data: [DONE]`.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from legorl.proxy import fields as F
from legorl.proxy.completion import ReasoningDelta, StreamEvent, TextDelta
from legorl.proxy.errors import bad_request
from legorl.proxy.pipeline import Parsed, TurnRun
from legorl.proxy.renderer import ChatRequest
from legorl.types import Dialect, FinishReason

DIALECT = Dialect.OPENAI_CHAT
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def flatten(content: Any, where: str) -> str:
    """Message content (string, null or a list of parts) as one text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: expected a string, null or an array of parts, got {type(content).__name__}")
    out: list[str] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            out.append(part)
            continue
        part = F.as_dict(part, f"{where}[{i}]")
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            out.append(F.get(part, "text", str, f"{where}[{i}].", ""))
        elif kind in ("image_url", "image", "input_image"):
            out.append(F.IMAGE_PLACEHOLDER)
        elif kind == "refusal":
            out.append(F.get(part, "refusal", str, f"{where}[{i}].", ""))
        elif kind in ("input_audio", "audio"):
            raise F.unsupported("audio input", f"{where}[{i}]")
        elif kind in ("file", "input_file"):
            out.append("[file]")
        else:
            raise bad_request(f"{where}[{i}].type: unknown content part type {kind!r}", param=f"{where}[{i}].type")
    return "\n".join(out)


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    calls = []
    for k, c in enumerate(F.as_list(raw, where)):
        w = f"{where}[{k}]"
        c = F.as_dict(c, w)
        fn = F.as_dict(c.get("function"), f"{w}.function")
        calls.append(
            {
                "id": F.get(c, "id", str, f"{w}.", "") or F.new_id("call_"),
                "type": "function",
                "function": {
                    "name": F.get(fn, "name", str, f"{w}.function.", required=True),
                    "arguments": F.json_args(fn.get("arguments"), f"{w}.function.arguments"),
                },
            }
        )
    return calls


def convert_messages(raw: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for i, m in enumerate(F.as_list(raw, "messages")):
        w = f"messages[{i}]"
        m = F.as_dict(m, w)
        raw_role = m.get("role")
        role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
        if role is None:
            raise bad_request(
                f"{w}.role: {m.get('role')!r} is not one of system, developer, user, assistant, tool", param=f"{w}.role"
            )
        content = flatten(m.get("content"), f"{w}.content")
        if role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": content}
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            if isinstance(reasoning, str) and reasoning:
                out["reasoning_content"] = reasoning
            if m.get("tool_calls"):
                out["tool_calls"] = _tool_calls(m["tool_calls"], f"{w}.tool_calls")
            msgs.append(out)
        elif role == "tool":
            msgs.append({"role": "tool", "tool_call_id": str(m.get("tool_call_id") or ""), "content": content})
        else:
            msgs.append({"role": role, "content": content})
    if not msgs:
        raise bad_request("messages: must contain at least one message", param="messages")
    return msgs


def convert_tools(raw: Any) -> list[dict[str, Any]]:
    tools = []
    for i, t in enumerate(F.as_list(raw, "tools")):
        t = F.as_dict(t, f"tools[{i}]")
        if t.get("type", "function") != "function":
            raise F.unsupported(f"tools[{i}].type {t.get('type')!r} (only 'function' tools)", f"tools[{i}].type")
        fn = F.as_dict(t.get("function"), f"tools[{i}].function")
        F.get(fn, "name", str, f"tools[{i}].function.", required=True)
        tools.append({"type": "function", "function": fn})
    return tools


def parse(body: dict[str, Any]) -> Parsed:
    n = F.get(body, "n", int, "", 1)
    if n != 1:
        raise F.unsupported(f"n={n} (one choice per request)", "n")
    modalities = body.get("modalities")
    if body.get("audio") is not None or (isinstance(modalities, list) and "audio" in modalities):
        raise F.unsupported("audio output", "audio")
    msgs = convert_messages(F.get(body, "messages", list, "", required=True))
    tools = convert_tools(body["tools"]) if body.get("tools") else []
    prefill = msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls")
    stream = F.get(body, "stream", bool, "", False)
    opts = F.get(body, "stream_options", dict, "", None) or {}
    max_tokens = F.positive_int(body, "max_completion_tokens") or F.positive_int(body, "max_tokens")
    requested = {
        "temperature": F.number(body, "temperature"),
        "top_p": F.number(body, "top_p"),
        "max_tokens": max_tokens,
        "seed": F.get(body, "seed", int, ""),
    }
    return Parsed(
        chat=ChatRequest(msgs, tools, add_generation_prompt=not prefill),
        model=F.get(body, "model", str, "", ""),
        stream=stream,
        max_tokens=max_tokens,
        stop=F.stop_list(body, "stop"),
        requested={k: v for k, v in requested.items() if v is not None},
        options={"include_usage": bool(opts.get("include_usage"))},
    )


def finish_reason(run: TurnRun) -> str:
    if run.finish_reason is FinishReason.LENGTH:
        return "length"
    if run.result is not None and run.result.tool_calls:
        return "tool_calls"
    return "stop"


def usage(run: TurnRun) -> dict[str, int]:
    return {
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "total_tokens": run.prompt_tokens + run.completion_tokens,
    }


def response(run: TurnRun) -> bytes:
    res = run.result
    assert res is not None
    msg: dict[str, Any] = {"role": "assistant", "content": res.content if (res.content or not res.tool_calls) else None}
    if res.reasoning is not None:
        msg["reasoning_content"] = res.reasoning
    if res.tool_calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in res.tool_calls
        ]
    return orjson.dumps(
        {
            "id": F.new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": run.parsed.model,
            "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish_reason(run)}],
            "usage": usage(run),
        }
    )


class Stream:
    """Chat-completion chunks; every chunk shares one prebuilt prefix."""

    def __init__(self, run: TurnRun) -> None:
        self.run = run
        head = {
            "id": F.new_id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": run.parsed.model,
        }
        self.prefix = b"data: " + orjson.dumps(head)[:-1] + b',"choices":[{"index":0,"delta":'
        self.head_json = orjson.dumps(head)[:-1]

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        end = (
            b',"logprobs":null,"finish_reason":null}]}\n\n'
            if finish is None
            else (b',"logprobs":null,"finish_reason":"' + finish.encode() + b'"}]}\n\n')
        )
        return self.prefix + orjson.dumps(delta) + end

    def head(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def events(self, evs: list[StreamEvent]) -> bytes:
        out = []
        for e in evs:
            if type(e) is TextDelta:
                out.append(self._chunk({"content": e.text}))
            elif type(e) is ReasoningDelta:
                out.append(self._chunk({"reasoning_content": e.text}))
            elif e.name is not None:  # first delta of a call
                out.append(
                    self._chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": e.index,
                                    "id": e.id,
                                    "type": "function",
                                    "function": {"name": e.name, "arguments": e.arguments},
                                }
                            ]
                        }
                    )
                )
            else:
                out.append(self._chunk({"tool_calls": [{"index": e.index, "function": {"arguments": e.arguments}}]}))
        return b"".join(out)

    def tail(self) -> bytes:
        out = self._chunk({}, finish_reason(self.run))
        if self.run.parsed.options.get("include_usage"):
            out += b"data: " + self.head_json + b',"choices":[],"usage":' + orjson.dumps(usage(self.run)) + b"}\n\n"
        return out + b"data: [DONE]\n\n"
