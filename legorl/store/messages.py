"""Raw harness requests (three API dialects) → one flat list of display messages.

The store keeps each turn's request exactly as the harness sent it; the UI and the
full-text index need to read it without caring whether it came as OpenAI chat messages,
Anthropic content blocks or Responses-API input items. Every message becomes
`{"role", "kind", "text", "name"?, "call_id"?, "is_error"?}` with kind one of
`text`, `thinking`, `tool_call`, `tool_result`. Unknown shapes are shown as their JSON
rather than dropped: the UI must never hide what the harness actually sent.
"""

from __future__ import annotations

import json
from typing import Any

LIST_KEYS = ("messages", "input")  # where the growing conversation lives, by dialect


def split_request(request: dict[str, Any]) -> tuple[str | None, list[Any], dict[str, Any]]:
    """(key of the conversation list, its items, everything else in the request)."""
    for key in LIST_KEYS:
        if isinstance(request.get(key), list):
            rest = {k: v for k, v in request.items() if k != key}
            return key, list(request[key]), rest
    return None, [], dict(request)


def _text_of(content: Any) -> str:
    """Content as text: a string, or the text parts of a block list (others as JSON)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif isinstance(block, str):
                parts.append(block)
            else:
                parts.append(json.dumps(block, ensure_ascii=False))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _args_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _openai_message(m: dict[str, Any]) -> list[dict[str, Any]]:
    role = m.get("role", "?")
    out: list[dict[str, Any]] = []
    if m.get("reasoning_content"):
        out.append({"role": role, "kind": "thinking", "text": str(m["reasoning_content"])})
    if role == "tool":
        return out + [
            {
                "role": role,
                "kind": "tool_result",
                "text": _text_of(m.get("content")),
                "call_id": m.get("tool_call_id"),
                "name": m.get("name"),
            }
        ]
    text = _text_of(m.get("content"))
    if text:
        out.append({"role": role, "kind": "text", "text": text})
    for call in m.get("tool_calls") or []:
        fn = call.get("function", call)
        out.append(
            {
                "role": role,
                "kind": "tool_call",
                "name": fn.get("name"),
                "text": _args_text(fn.get("arguments", "")),
                "call_id": call.get("id"),
            }
        )
    return out


def _anthropic_message(m: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = m.get("role", "?"), m.get("content")
    if not isinstance(content, list):
        return [{"role": role, "kind": "text", "text": _text_of(content)}]
    out: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            out.append({"role": role, "kind": "text", "text": block.get("text", "")})
        elif kind in ("thinking", "redacted_thinking"):
            out.append({"role": role, "kind": "thinking", "text": block.get("thinking", "")})
        elif kind == "tool_use":
            out.append(
                {
                    "role": role,
                    "kind": "tool_call",
                    "name": block.get("name"),
                    "text": _args_text(block.get("input", {})),
                    "call_id": block.get("id"),
                }
            )
        elif kind == "tool_result":
            out.append(
                {
                    "role": role,
                    "kind": "tool_result",
                    "text": _text_of(block.get("content")),
                    "call_id": block.get("tool_use_id"),
                    "is_error": bool(block.get("is_error")),
                }
            )
        else:
            out.append({"role": role, "kind": "text", "text": _text_of([block])})
    return out


def _responses_item(item: Any) -> list[dict[str, Any]]:
    if isinstance(item, str):
        return [{"role": "user", "kind": "text", "text": item}]
    kind = item.get("type", "message")
    if kind == "function_call":
        return [
            {
                "role": "assistant",
                "kind": "tool_call",
                "name": item.get("name"),
                "text": _args_text(item.get("arguments", "")),
                "call_id": item.get("call_id"),
            }
        ]
    if kind == "function_call_output":
        return [
            {
                "role": "tool",
                "kind": "tool_result",
                "text": _text_of(item.get("output")),
                "call_id": item.get("call_id"),
            }
        ]
    if kind == "reasoning":
        summary = _text_of(item.get("summary")) or _text_of(item.get("content"))
        return [{"role": "assistant", "kind": "thinking", "text": summary}]
    if kind == "message":
        return [{"role": item.get("role", "?"), "kind": "text", "text": _text_of(item.get("content"))}]
    return [{"role": "?", "kind": "text", "text": json.dumps(item, ensure_ascii=False)}]


def display_messages(items: list[Any], dialect: str) -> list[dict[str, Any]]:
    """Flatten conversation items of one dialect into display messages, in order."""
    out: list[dict[str, Any]] = []
    for item in items:
        if dialect == "responses":
            out += _responses_item(item)
        elif not isinstance(item, dict):
            out.append({"role": "?", "kind": "text", "text": _text_of(item)})
        elif dialect == "anthropic":
            out += _anthropic_message(item)
        else:
            out += _openai_message(item)
    return out


def system_messages(rest: dict[str, Any]) -> list[dict[str, Any]]:
    """System prompt carried outside the message list (Anthropic `system`, Responses `instructions`)."""
    out = []
    for key in ("system", "instructions"):
        if rest.get(key):
            out.append({"role": "system", "kind": "text", "text": _text_of(rest[key])})
    return out


def completion_messages(response_text: str, tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the client received for a turn: its text and the tool calls parsed from it."""
    out = [{"role": "assistant", "kind": "text", "text": response_text}] if response_text else []
    for call in tool_calls:
        fn = call.get("function", call)
        args = fn.get("arguments", fn.get("input", ""))
        out.append(
            {
                "role": "assistant",
                "kind": "tool_call",
                "name": fn.get("name"),
                "text": _args_text(args),
                "call_id": call.get("id") or call.get("call_id"),
            }
        )
    return out


def search_text(messages: list[dict[str, Any]]) -> str:
    """Text the full-text index sees for a list of display messages."""
    return "\n".join(f"{m.get('name') or ''} {m.get('text') or ''}".strip() for m in messages)
