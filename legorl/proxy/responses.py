"""OpenAI Responses (`POST /v1/responses`): Codex-style clients, stateless use.

Request: `instructions`, `input` as a string or items — messages (input_text /
output_text parts; images become a placeholder), `reasoning`, `function_call` and
`function_call_output` items — and function `tools`, alone or grouped in `namespace`
tools (the policy sees each function by its name; a call to one goes back with its
`namespace`). The proxy keeps no response store, so `previous_response_id` is refused
with a message saying to send the whole conversation (`store: false` clients already
do). Hosted tools (`web_search`, …) are refused by name: no local policy can run them.

Stateless reasoning (`include: ["reasoning.encrypted_content"]`, what Codex CLI sends):
reasoning items then also carry `encrypted_content` — NOT encrypted, the reasoning text
itself, base64 behind a `legorl:` prefix — and a reasoning item that comes back with only
that (no `content`, as clients that replay just the opaque blob do) is read from it, so
the policy's reasoning reappears in the prompt exactly as sampled. A foreign blob (another
server's encryption) cannot be read and falls back to the item's summary.

Response: a `response` object with reasoning, message and function_call output items, or
the event stream `response.created`, `response.in_progress`, per item
`response.output_item.added` … `response.output_item.done` (with `content_part.*`,
`output_text.delta/done`, `reasoning_text.delta/done`,
`function_call_arguments.delta/done` inside), then `response.completed` (or
`response.incomplete` when the token limit was hit).
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

import orjson

from legorl.proxy import fields as F
from legorl.proxy.completion import ReasoningDelta, StreamEvent, TextDelta
from legorl.proxy.errors import bad_request
from legorl.proxy.openai_chat import flatten
from legorl.proxy.pipeline import Parsed, TurnRun
from legorl.proxy.renderer import ChatRequest
from legorl.types import Dialect, FinishReason

DIALECT = Dialect.RESPONSES
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


ENCRYPTED = "reasoning.encrypted_content"
_BLOB = "legorl:"


def seal(text: str) -> str:
    """The `encrypted_content` of a reasoning item: the text, base64, behind a prefix."""
    return _BLOB + base64.b64encode(text.encode()).decode()


def unseal(blob: Any) -> str | None:
    """The reasoning text of a blob `seal` made, or None (a foreign or broken blob)."""
    if not isinstance(blob, str) or not blob.startswith(_BLOB):
        return None
    try:
        return base64.b64decode(blob[len(_BLOB) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def _reasoning_text(item: dict[str, Any], w: str) -> str:
    """A reasoning input item's text: its content, else its own sealed blob, else its summary."""
    if item.get("content"):
        key = "content"
    elif (text := unseal(item.get("encrypted_content"))) is not None:
        return text
    else:
        key = "summary"
    parts = [p.get("text", "") for p in F.as_list(item.get(key) or [], f"{w}.{key}") if isinstance(p, dict)]
    return "\n".join(p for p in parts if isinstance(p, str))


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    instructions = F.get(body, "instructions", str, "", None)
    if instructions:
        msgs.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        return [*msgs, {"role": "user", "content": raw}]
    if raw is None:
        raise bad_request("input: required field is missing", param="input")
    reasoning: str | None = None
    for i, item in enumerate(F.as_list(raw, "input")):
        w = f"input[{i}]"
        item = F.as_dict(item, w)
        kind = item.get("type", "message")
        if kind == "message":
            raw_role = item.get("role")
            role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
            if role is None:
                raise bad_request(
                    f"{w}.role: {item.get('role')!r} is not one of system, developer, user, assistant",
                    param=f"{w}.role",
                )
            m: dict[str, Any] = {"role": role, "content": flatten(item.get("content"), f"{w}.content")}
            if role == "assistant" and reasoning is not None:
                m["reasoning_content"], reasoning = reasoning, None
            msgs.append(m)
        elif kind == "reasoning":
            reasoning = _reasoning_text(item, w)
        elif kind == "function_call":
            call = {
                "id": F.get(item, "call_id", str, f"{w}.", required=True),
                "type": "function",
                "function": {
                    "name": F.get(item, "name", str, f"{w}.", required=True),
                    "arguments": F.json_args(item.get("arguments"), f"{w}.arguments"),
                },
            }
            last = msgs[-1] if msgs else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                if reasoning is not None:
                    last["reasoning_content"], reasoning = reasoning, None
                msgs.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            out = item.get("output")
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": F.get(item, "call_id", str, f"{w}.", ""),
                    "content": out if isinstance(out, str) else flatten(out, f"{w}.output"),
                }
            )
        else:
            raise F.unsupported(f"input item type {kind!r} ({w})", f"{w}.type")
    if not msgs or all(m["role"] == "system" for m in msgs):
        raise bad_request("input: must contain at least one message", param="input")
    return msgs


def _function(t: dict[str, Any], w: str) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": F.get(t, "name", str, f"{w}.", required=True)}
    if t.get("description") is not None:
        fn["description"] = t["description"]
    fn["parameters"] = F.get(t, "parameters", dict, f"{w}.", {"type": "object", "properties": {}})
    return {"type": "function", "function": fn}


def _tools(raw: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Function tools, the functions of `namespace` tools among them (Codex's sub-agent
    tools come as one), and each namespaced function's namespace. The policy sees every
    function by its own name (not the namespace's description: chat templates have no
    place for it); a call to a namespaced one goes back with its `namespace`,
    as the API returns it. A name in two places is refused: the call would be ambiguous."""
    tools: list[dict[str, Any]] = []
    namespaces: dict[str, str] = {}
    where: dict[str, str] = {}
    for i, t in enumerate(F.as_list(raw, "tools")):
        t = F.as_dict(t, f"tools[{i}]")
        if t.get("type") == "namespace":
            ns = F.get(t, "name", str, f"tools[{i}].", required=True)
            members = [
                (f"tools[{i}].tools[{j}]", F.as_dict(m, f"tools[{i}].tools[{j}]"))
                for j, m in enumerate(F.as_list(t.get("tools") or [], f"tools[{i}].tools"))
            ]
        else:
            ns, members = "", [(f"tools[{i}]", t)]
        for w, m in members:
            if m.get("type") != "function":
                raise F.unsupported(
                    f"{w}.type {m.get('type')!r} (only 'function' tools, alone or in a namespace; hosted "
                    f"tools cannot run on a local policy: turn them off in the client)",
                    f"{w}.type",
                )
            tool = _function(m, w)
            name = tool["function"]["name"]
            if name in where:
                raise bad_request(
                    f"{w}.name: {name!r} is also {where[name]}: a call to it would be ambiguous", param=f"{w}.name"
                )
            where[name] = w
            if ns:
                namespaces[name] = ns
            tools.append(tool)
    return tools, namespaces


def parse(body: dict[str, Any]) -> Parsed:
    if body.get("previous_response_id") is not None:
        raise F.unsupported(
            "previous_response_id (no response store: send the whole conversation in `input`)", "previous_response_id"
        )
    msgs = _messages(body)
    tools, namespaces = _tools(body["tools"]) if body.get("tools") else ([], {})
    max_tokens = F.positive_int(body, "max_output_tokens")
    requested = {
        "temperature": F.number(body, "temperature"),
        "top_p": F.number(body, "top_p"),
        "max_tokens": max_tokens,
    }
    return Parsed(
        chat=ChatRequest(msgs, tools, add_generation_prompt=True),
        model=F.get(body, "model", str, "", ""),
        stream=F.get(body, "stream", bool, "", False),
        max_tokens=max_tokens,
        requested={k: v for k, v in requested.items() if v is not None},
        options={
            "instructions": body.get("instructions"),
            "tools": body.get("tools") or [],
            "namespaces": namespaces,
            "sealed": ENCRYPTED in (body.get("include") or []),
        },
    )


def _usage(run: TurnRun) -> dict[str, Any]:
    return {
        "input_tokens": run.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": run.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": run.prompt_tokens + run.completion_tokens,
    }


def _envelope(run: TurnRun, rid: str, created: int, output: list[dict[str, Any]], done: bool) -> dict[str, Any]:
    incomplete = done and run.finish_reason is FinishReason.LENGTH
    p = run.params
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": ("incomplete" if incomplete else "completed") if done else "in_progress",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": run.parsed.options.get("instructions"),
        "max_output_tokens": run.parsed.max_tokens,
        "model": run.parsed.model,
        "output": output,
        "parallel_tool_calls": True,
        "temperature": p.temperature if p else None,
        "top_p": p.top_p if p else None,
        "tool_choice": "auto",
        "tools": run.parsed.options.get("tools", []),
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": False,
        "usage": _usage(run) if done else None,
    }


def _reasoning_item(iid: str, text: str, status: str, sealed: bool = False) -> dict[str, Any]:
    item = {
        "type": "reasoning",
        "id": iid,
        "summary": [],
        "status": status,
        "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else [],
    }
    if sealed:  # include: ["reasoning.encrypted_content"]
        item["encrypted_content"] = seal(text) if status == "completed" else None
    return item


def _message_item(iid: str, text: str, status: str) -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    )
    return {"type": "message", "id": iid, "status": status, "role": "assistant", "content": content}


def _call_item(iid: str, call_id: str, name: str, args: str, status: str, namespace: str = "") -> dict[str, Any]:
    item = {"type": "function_call", "id": iid, "call_id": call_id, "name": name, "arguments": args, "status": status}
    if namespace:  # a function of a `namespace` tool
        item["namespace"] = namespace
    return item


def response(run: TurnRun) -> bytes:
    res = run.result
    assert res is not None
    out: list[dict[str, Any]] = []
    if res.reasoning is not None:
        sealed = bool(run.parsed.options.get("sealed", False))
        out.append(_reasoning_item(F.new_id("rs_"), res.reasoning, "completed", sealed))
    if res.content or not res.tool_calls:
        out.append(_message_item(F.new_id("msg_"), res.content, "completed"))
    ns = run.parsed.options.get("namespaces") or {}
    for c in res.tool_calls:
        out.append(_call_item(F.new_id("fc_"), c.id, c.name, c.arguments, "completed", ns.get(c.name, "")))
    return orjson.dumps(_envelope(run, F.new_id("resp_"), int(time.time()), out, True))


class Stream:
    """Output items opened and closed as the policy switches between reasoning, text and
    calls; every event carries a running `sequence_number`."""

    def __init__(self, run: TurnRun) -> None:
        self.run = run
        self.rid = F.new_id("resp_")
        self.created = int(time.time())
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # finished output items
        self.open: dict[str, Any] | None = None  # {"kind", "id", "text", ...}
        self.pending_ws = ""
        self.sealed = bool(run.parsed.options.get("sealed", False))
        self.namespaces: dict[str, str] = run.parsed.options.get("namespaces") or {}

    def _ev(self, name: str, data: dict[str, Any]) -> bytes:
        data["type"] = name
        data["sequence_number"] = self.seq
        self.seq += 1
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def head(self) -> bytes:
        env = _envelope(self.run, self.rid, self.created, [], False)
        return self._ev("response.created", {"response": env}) + self._ev("response.in_progress", {"response": env})

    def _close(self, out: list[bytes]) -> None:
        o = self.open
        if o is None:
            return
        self.open = None
        idx = len(self.items)
        base = {"item_id": o["id"], "output_index": idx}
        if o["kind"] == "message":
            part = {"type": "output_text", "text": o["text"], "annotations": [], "logprobs": []}
            out.append(
                self._ev("response.output_text.done", {**base, "content_index": 0, "text": o["text"], "logprobs": []})
            )
            out.append(self._ev("response.content_part.done", {**base, "content_index": 0, "part": part}))
            item = _message_item(o["id"], o["text"], "completed")
        elif o["kind"] == "reasoning":
            part = {"type": "reasoning_text", "text": o["text"]}
            out.append(self._ev("response.reasoning_text.done", {**base, "content_index": 0, "text": o["text"]}))
            out.append(self._ev("response.content_part.done", {**base, "content_index": 0, "part": part}))
            item = _reasoning_item(o["id"], o["text"], "completed", self.sealed)
        else:
            out.append(
                self._ev("response.function_call_arguments.done", {**base, "name": o["name"], "arguments": o["text"]})
            )
            item = _call_item(
                o["id"], o["call_id"], o["name"], o["text"], "completed", self.namespaces.get(o["name"], "")
            )
        out.append(self._ev("response.output_item.done", {"output_index": idx, "item": item}))
        self.items.append(item)

    def _open(self, out: list[bytes], kind: str, **extra: Any) -> dict[str, Any]:
        self._close(out)
        prefix = {"message": "msg_", "reasoning": "rs_", "function_call": "fc_"}[kind]
        o = {"kind": kind, "id": F.new_id(prefix), "text": "", **extra}
        self.open = o
        idx = len(self.items)
        if kind == "message":
            item = _message_item(o["id"], "", "in_progress")
            part: dict[str, Any] | None = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        elif kind == "reasoning":
            item = _reasoning_item(o["id"], "", "in_progress", self.sealed)
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = _call_item(
                o["id"], extra["call_id"], extra["name"], "", "in_progress", self.namespaces.get(extra["name"], "")
            )
            part = None
        out.append(self._ev("response.output_item.added", {"output_index": idx, "item": item}))
        if part is not None:
            out.append(
                self._ev(
                    "response.content_part.added",
                    {"item_id": o["id"], "output_index": idx, "content_index": 0, "part": part},
                )
            )
        return o

    def _text(self, out: list[bytes], text: str) -> None:
        o = self.open
        if o is None or o["kind"] != "message":
            o = self._open(out, "message")
        o["text"] += text
        out.append(
            self._ev(
                "response.output_text.delta",
                {
                    "item_id": o["id"],
                    "output_index": len(self.items),
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                },
            )
        )

    def events(self, evs: list[StreamEvent]) -> bytes:
        out: list[bytes] = []
        for e in evs:
            if type(e) is TextDelta:
                text = e.text
                if self.open is None or self.open["kind"] != "message":
                    if not text.strip():
                        self.pending_ws += text
                        continue
                    text, self.pending_ws = self.pending_ws + text, ""
                self._text(out, text)
            elif type(e) is ReasoningDelta:
                o = self.open if self.open is not None and self.open["kind"] == "reasoning" else None
                if o is None:
                    o = self._open(out, "reasoning")
                o["text"] += e.text
                out.append(
                    self._ev(
                        "response.reasoning_text.delta",
                        {"item_id": o["id"], "output_index": len(self.items), "content_index": 0, "delta": e.text},
                    )
                )
            elif e.name is not None:
                self.pending_ws = ""
                o = self._open(out, "function_call", call_id=e.id, name=e.name)
                if e.arguments:
                    o["text"] += e.arguments
                    out.append(
                        self._ev(
                            "response.function_call_arguments.delta",
                            {"item_id": o["id"], "output_index": len(self.items), "delta": e.arguments},
                        )
                    )
            else:
                o = self.open
                assert o is not None
                o["text"] += e.arguments
                out.append(
                    self._ev(
                        "response.function_call_arguments.delta",
                        {"item_id": o["id"], "output_index": len(self.items), "delta": e.arguments},
                    )
                )
        return b"".join(out)

    def tail(self) -> bytes:
        out: list[bytes] = []
        res = self.run.result
        if self.pending_ws and not (res and res.tool_calls):
            self._text(out, self.pending_ws)
        if not self.items and self.open is None:
            self._open(out, "message")
        self._close(out)
        env = _envelope(self.run, self.rid, self.created, self.items, True)
        name = "response.incomplete" if env["status"] == "incomplete" else "response.completed"
        out.append(self._ev(name, {"response": env}))
        return b"".join(out)
