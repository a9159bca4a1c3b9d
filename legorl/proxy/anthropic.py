"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): Claude Code.

Request: `system` as a string or text blocks; messages of text, image (→ placeholder),
thinking (→ reasoning), tool_use (→ tool call, its `input` object serialised as the policy
writes JSON) and tool_result blocks (→ tool messages, images inside → placeholder);
`role: "system"` inside `messages` (Claude Code sends it for unknown model names);
`stop_sequences`, `max_tokens`. `thinking`, `metadata`, `cache_control`,
`context_management`, `output_config`, `defer_loading`, `anthropic-beta` are ignored.

Response: a `message` JSON, or the event sequence Claude Code accepts: `message_start`
(request model echoed, usage.input_tokens), `ping`, per block `content_block_start` /
deltas / `content_block_stop` (thinking: `thinking_delta` + a non-empty placeholder
`signature_delta`; text: `text_delta`; tool_use: `input_json_delta`), `message_delta`
(stop_reason, usage), `message_stop`.
"""

from __future__ import annotations

from typing import Any

import orjson

from legorl.proxy import fields as F
from legorl.proxy.completion import ReasoningDelta, StreamEvent, TextDelta
from legorl.proxy.errors import bad_request
from legorl.proxy.pipeline import Parsed, TurnRun
from legorl.proxy.renderer import ChatRequest
from legorl.types import Dialect, FinishReason

DIALECT = Dialect.ANTHROPIC
# Claude Code drops thinking blocks that come without a signature in some versions.
SIGNATURE = "legorl-unsigned-thinking"


def _block_text(blocks: Any, where: str) -> str:
    """Text of a string or a list of text/image blocks (tool_result content, system)."""
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    out: list[str] = []
    for i, b in enumerate(F.as_list(blocks, where)):
        b = F.as_dict(b, f"{where}[{i}]")
        kind = b.get("type")
        if kind == "text":
            out.append(F.get(b, "text", str, f"{where}[{i}].", ""))
        elif kind == "image":
            out.append(F.IMAGE_PLACEHOLDER)
        elif kind == "document":
            out.append("[document]")
        else:
            raise bad_request(f"{where}[{i}].type: unsupported block type {kind!r}", param=f"{where}[{i}].type")
    return "\n".join(out)


def _assistant(blocks: Any, where: str) -> dict[str, Any]:
    if isinstance(blocks, str) or blocks is None:
        return {"role": "assistant", "content": blocks or ""}
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, b in enumerate(F.as_list(blocks, where)):
        w = f"{where}[{i}]"
        b = F.as_dict(b, w)
        kind = b.get("type")
        if kind == "text":
            texts.append(F.get(b, "text", str, f"{w}.", ""))
        elif kind == "thinking":
            reasoning.append(F.get(b, "thinking", str, f"{w}.", ""))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            calls.append(
                {
                    "id": F.get(b, "id", str, f"{w}.", "") or F.new_id("toolu_"),
                    "type": "function",
                    "function": {
                        "name": F.get(b, "name", str, f"{w}.", required=True),
                        "arguments": F.tool_input_json(b.get("input", {}), f"{w}.input"),
                    },
                }
            )
        else:
            raise bad_request(f"{w}.type: unsupported assistant block type {kind!r}", param=f"{w}.type")
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        out["reasoning_content"] = "\n".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return out


def _user(blocks: Any, role: str, where: str) -> list[dict[str, Any]]:
    """A user message: its tool_result blocks become tool messages (in order), the rest
    one user (or system) message after them."""
    if isinstance(blocks, str):
        return [{"role": role, "content": blocks}]
    tools: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, b in enumerate(F.as_list(blocks, where)):
        w = f"{where}[{i}]"
        b = F.as_dict(b, w)
        kind = b.get("type")
        if kind == "tool_result":
            tools.append(
                {
                    "role": "tool",
                    "tool_call_id": str(b.get("tool_use_id") or ""),
                    "content": _block_text(b.get("content"), f"{w}.content"),
                }
            )
        elif kind == "text":
            texts.append(F.get(b, "text", str, f"{w}.", ""))
        elif kind == "image":
            texts.append(F.IMAGE_PLACEHOLDER)
        elif kind == "document":
            texts.append("[document]")
        else:
            raise bad_request(f"{w}.type: unsupported block type {kind!r}", param=f"{w}.type")
    if texts or not tools:
        tools.append({"role": role, "content": "\n".join(texts)})
    return tools


def convert_tools(raw: Any) -> list[dict[str, Any]]:
    tools = []
    for i, t in enumerate(F.as_list(raw, "tools")):
        t = F.as_dict(t, f"tools[{i}]")
        if t.get("type") not in (None, "custom"):
            raise F.unsupported(f"server tool {t.get('type')!r} in tools[{i}]", f"tools[{i}].type")
        fn: dict[str, Any] = {"name": F.get(t, "name", str, f"tools[{i}].", required=True)}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        fn["parameters"] = F.get(t, "input_schema", dict, f"tools[{i}].", {"type": "object", "properties": {}})
        tools.append({"type": "function", "function": fn})
    return tools


def to_chat(body: dict[str, Any]) -> ChatRequest:
    msgs: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        msgs.append({"role": "system", "content": _block_text(system, "system")})
    raw = F.get(body, "messages", list, "", required=True)
    if not raw:
        raise bad_request("messages: must contain at least one message", param="messages")
    for i, m in enumerate(raw):
        w = f"messages[{i}]"
        m = F.as_dict(m, w)
        role = m.get("role")
        if role == "assistant":
            msgs.append(_assistant(m.get("content"), f"{w}.content"))
        elif role in ("user", "system"):
            msgs.extend(_user(m.get("content"), role, f"{w}.content"))
        else:
            raise bad_request(f"{w}.role: {role!r} is not one of user, assistant, system", param=f"{w}.role")
    tools = convert_tools(body["tools"]) if body.get("tools") else []
    prefill = msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls")
    return ChatRequest(msgs, tools, add_generation_prompt=not prefill)


def parse(body: dict[str, Any]) -> Parsed:
    chat = to_chat(body)
    max_tokens = F.positive_int(body, "max_tokens")
    requested = {
        "temperature": F.number(body, "temperature"),
        "top_p": F.number(body, "top_p"),
        "top_k": F.get(body, "top_k", int, ""),
        "max_tokens": max_tokens,
    }
    return Parsed(
        chat=chat,
        model=F.get(body, "model", str, "", ""),
        stream=F.get(body, "stream", bool, "", False),
        max_tokens=max_tokens,
        stop=F.stop_list(body, "stop_sequences"),
        requested={k: v for k, v in requested.items() if v is not None},
    )


def stop_reason(run: TurnRun) -> str:
    if run.finish_reason is FinishReason.LENGTH:
        return "max_tokens"
    if run.result is not None and run.result.tool_calls:
        return "tool_use"
    if run.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def _usage(run: TurnRun) -> dict[str, int]:
    return {
        "input_tokens": run.prompt_tokens,
        "output_tokens": run.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _tool_input(arguments: str) -> Any:
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}


def response(run: TurnRun) -> bytes:
    res = run.result
    assert res is not None
    content: list[dict[str, Any]] = []
    if res.reasoning is not None:
        content.append({"type": "thinking", "thinking": res.reasoning, "signature": SIGNATURE})
    if res.content or not res.tool_calls:
        content.append({"type": "text", "text": res.content})
    for c in res.tool_calls:
        content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": _tool_input(c.arguments)})
    return orjson.dumps(
        {
            "id": F.new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": run.parsed.model,
            "content": content,
            "stop_reason": stop_reason(run),
            "stop_sequence": run.stop_sequence,
            "usage": _usage(run),
        }
    )


def _event(name: bytes, data: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(data) + b"\n\n"


_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'


class Stream:
    """Content blocks opened and closed as the policy switches between thinking, text
    and tool calls. Whitespace between blocks is held back (it would otherwise open an
    empty-looking text block beside every tool call) and only sent if nothing else comes."""

    def __init__(self, run: TurnRun) -> None:
        self.run = run
        self.index = -1
        self.open: str | None = None  # thinking | text | tool_use
        self.pending_ws = ""
        self.sent_any = False
        self.msg_id = F.new_id("msg_")

    def head(self) -> bytes:
        msg = {
            "id": self.msg_id,
            "type": "message",
            "role": "assistant",
            "model": self.run.parsed.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.run.prompt_tokens,
                "output_tokens": 1,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return (
            _event(b"message_start", {"type": "message_start", "message": msg})
            + b'event: ping\ndata: {"type":"ping"}\n\n'
        )

    def _close(self, out: list[bytes]) -> None:
        if self.open == "thinking":
            out.append(
                _event(
                    b"content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self.index,
                        "delta": {"type": "signature_delta", "signature": SIGNATURE},
                    },
                )
            )
        if self.open is not None:
            out.append(_STOP % self.index)
            self.open = None

    def _start(self, out: list[bytes], kind: str, block: dict[str, Any]) -> None:
        self._close(out)
        self.index += 1
        self.open = kind
        self.sent_any = True
        out.append(
            _event(b"content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event(b"content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def events(self, evs: list[StreamEvent]) -> bytes:
        out: list[bytes] = []
        for e in evs:
            if type(e) is TextDelta:
                text = e.text
                if self.open != "text":
                    if not text.strip():
                        self.pending_ws += text
                        continue
                    text, self.pending_ws = self.pending_ws + text, ""
                    self._start(out, "text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": text}))
            elif type(e) is ReasoningDelta:
                if self.open != "thinking":
                    self._start(out, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": e.text}))
            elif e.name is not None:
                self.pending_ws = ""
                self._start(out, "tool_use", {"type": "tool_use", "id": e.id, "name": e.name, "input": {}})
                if e.arguments:
                    out.append(self._delta({"type": "input_json_delta", "partial_json": e.arguments}))
            else:
                out.append(self._delta({"type": "input_json_delta", "partial_json": e.arguments}))
        return b"".join(out)

    def tail(self) -> bytes:
        out: list[bytes] = []
        if self.pending_ws and not (self.run.result and self.run.result.tool_calls):
            self._start(out, "text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": self.pending_ws}))
        if not self.sent_any:  # a message has at least one block
            self._start(out, "text", {"type": "text", "text": ""})
        self._close(out)
        out.append(
            _event(
                b"message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason(self.run), "stop_sequence": self.run.stop_sequence},
                    "usage": _usage(self.run),
                },
            )
        )
        out.append(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        return b"".join(out)


def count_tokens_body(n: int) -> bytes:
    return orjson.dumps({"input_tokens": n})
