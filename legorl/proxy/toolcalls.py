"""Completion text → content, reasoning and tool calls; whole or streamed.

The format follows the model's family (`tool_format`; `auto` takes the one the chat
template writes, `legorl.proxy.template.detect_family`):
- `hermes` (Qwen2.5 / Qwen3 / Hermes; SmolLM2 through the tools shim):
  `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (a JSON list of such
  objects in one block is several calls, as SmolLM2 writes them)
- `qwen3_coder` (Qwen3-Coder, Qwen3.5 XML):
  `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`
- `glm45` (GLM-4.5): `<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>`
- `harmony` (gpt-oss): channels, see `legorl.proxy.harmony`.
Reasoning is a leading `<think>...</think>` block; a model whose generation prompt
already opened the block (Qwen3.5, Qwen3-Thinking: `starts_in_reasoning`) starts inside it.

A malformed call is never an error for the client: its text is returned as ordinary
content and the completion is flagged `format_error`, so the harness sees what the policy
wrote and the trainer sees a flagged turn (a 500 would turn a policy mistake into an
infrastructure failure). Arguments nested deeper than `ARGS_MAX_DEPTH` count as malformed:
the harness would replay them as `tool_use.input` and the proxy's own request depth limit
(`max_json_depth`, default 128) would refuse the next call, and the recorder could not
write them.

Streaming: text and reasoning stream as they are generated, character-exact. A tool call
is held until its closing tag so that it can be validated first (an already-streamed call
cannot be taken back); it is then emitted as a start delta plus argument pieces.
"""

from __future__ import annotations

import json
import re

from legorl.proxy.completion import (
    ParsedCompletion,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    call_deltas,
    new_call_id,
)
from legorl.proxy.harmony import HarmonyStreamParser, parse_harmony
from legorl.proxy.limits import depth_within

ARGS_MAX_DEPTH = 64  # deepest tool-call arguments object taken as a call (see the docstring)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_XML_FN = re.compile(r"^\s*<function=([^>\n]+)>\s*(.*?)\s*</function>\s*$", re.S)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _loose_value(raw: str) -> object:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return raw


def _hermes_call(obj: object) -> tuple[str, str] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit arguments as a JSON string
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            return None
    if not isinstance(args, dict) or not depth_within(args, ARGS_MAX_DEPTH):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def parse_calls(body: str, fmt: str) -> list[tuple[str, str]] | None:
    """The (name, arguments-JSON) pairs of one call block, or None when it is malformed."""
    if fmt == "qwen3_coder":
        m = _XML_FN.match(body)
        if not m:
            return None
        args = {key.strip(): _loose_value(raw) for key, raw in _XML_PARAM.findall(m.group(2))}
        if not depth_within(args, ARGS_MAX_DEPTH):
            return None
        return [(m.group(1).strip(), json.dumps(args, ensure_ascii=False))]
    if fmt == "glm45":
        name, _, rest = body.strip().partition("\n")
        name = name.strip()
        if not name or "<" in name or _GLM_ARG.sub("", rest).strip():
            return None
        args = {k.strip(): _loose_value(v) for k, v in _GLM_ARG.findall(rest)}
        if not depth_within(args, ARGS_MAX_DEPTH):
            return None
        return [(name, json.dumps(args, ensure_ascii=False))]
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    objs = obj if isinstance(obj, list) and obj else [obj]
    calls = [_hermes_call(o) for o in objs]
    return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


def parse_call(body: str, fmt: str) -> tuple[str, str] | None:
    """The single (name, arguments-JSON) of one call block (None if malformed or several)."""
    calls = parse_calls(body, fmt)
    return calls[0] if calls and len(calls) == 1 else None


def split_reasoning(text: str, starts_in_reasoning: bool = False) -> tuple[str | None, str]:
    """(reasoning, rest) when the text starts with a closed think block (or, when the
    prompt opened the block, with reasoning up to `</think>`; unclosed: all reasoning)."""
    if starts_in_reasoning:
        if THINK_CLOSE not in text:
            return text.strip("\n") or None, ""
        inner, rest = text.split(THINK_CLOSE, 1)
        return inner.strip("\n") or None, rest.lstrip("\n")
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN) and THINK_CLOSE in stripped:
        inner, rest = stripped[len(THINK_OPEN) :].split(THINK_CLOSE, 1)
        return inner.strip("\n"), rest.lstrip("\n")
    return None, text


def parse_completion(text: str, fmt: str = "hermes", starts_in_reasoning: bool = False) -> ParsedCompletion:
    """Parse a finished completion's text (end-of-turn token already removed)."""
    if fmt == "harmony":
        return parse_harmony(text)
    reasoning, rest = split_reasoning(text, starts_in_reasoning)
    content: list[str] = []
    calls: list[ToolCall] = []
    bad = False
    pos = 0
    while True:
        start = rest.find(OPEN, pos)
        if start < 0:
            content.append(rest[pos:])
            break
        end = rest.find(CLOSE, start)
        if end < 0:  # unclosed call: text, flagged
            content.append(rest[pos:])
            bad = True
            break
        content.append(rest[pos:start])
        parsed = parse_calls(rest[start + len(OPEN) : end], fmt)
        if parsed is None:
            content.append(rest[start : end + len(CLOSE)])
            bad = True
        else:
            calls.extend(ToolCall(new_call_id(), *p) for p in parsed)
        pos = end + len(CLOSE)
    text_out = "".join(content)
    if calls:
        text_out = text_out.strip()
    return ParsedCompletion(text_out, reasoning, calls, bad)


class StreamParser:
    """Incremental version of `parse_completion` that emits events as text arrives."""

    def __new__(cls, fmt: str = "hermes", starts_in_reasoning: bool = False):  # harmony: its own parser
        if fmt == "harmony" and cls is StreamParser:
            return HarmonyStreamParser()
        return super().__new__(cls)

    def __init__(self, fmt: str = "hermes", starts_in_reasoning: bool = False) -> None:
        self.fmt = fmt
        self.buf = ""  # text not yet emitted
        self.mode = "think" if starts_in_reasoning else "start"  # start | think | text | call
        self.text_parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.calls: list[ToolCall] = []
        self.bad = False
        self._after_think = False  # newlines right after </think> are not content

    def feed(self, delta: str) -> list[StreamEvent]:
        self.buf += delta
        events: list[StreamEvent] = []
        while True:
            before = (self.mode, len(self.buf))
            events.extend(self._step(final=False))
            if (self.mode, len(self.buf)) == before:
                return events

    def finish(self) -> tuple[list[StreamEvent], ParsedCompletion]:
        events: list[StreamEvent] = []
        while self.buf:
            before = (self.mode, len(self.buf))
            events.extend(self._step(final=True))
            if (self.mode, len(self.buf)) == before:
                break
        if self.mode == "call" or self.buf:  # unclosed call or leftover: flush as text
            self.bad = self.bad or self.mode == "call"
            leftover = (OPEN if self.mode == "call" else "") + self.buf
            self.buf, self.mode = "", "text"
            if leftover:
                events.append(self._text(leftover))
        content = "".join(self.text_parts)
        if self.calls:
            content = content.strip()
        reasoning = "".join(self.reasoning_parts).strip("\n") if self.reasoning_parts else None
        return events, ParsedCompletion(content, reasoning, self.calls, self.bad)

    def _text(self, s: str) -> TextDelta:
        self.text_parts.append(s)
        return TextDelta(s)

    def _step(self, final: bool) -> list[StreamEvent]:
        b = self.buf
        if self.mode == "start":
            s = b.lstrip()
            if not s and not final:
                return []
            if THINK_OPEN.startswith(s) and not final and s:
                return []  # could still become <think>
            if s.startswith(THINK_OPEN):
                self.buf, self.mode = s[len(THINK_OPEN) :].lstrip("\n"), "think"
            else:
                self.mode = "text"
            return []
        if self.mode == "think":
            i = b.find(THINK_CLOSE)
            if i >= 0:
                self.buf, self.mode = b[i + len(THINK_CLOSE) :].lstrip("\n"), "text"
                self._after_think = True
                return [self._reason(b[:i].rstrip("\n"))] if b[:i].rstrip("\n") else []
            keep = _partial_suffix(b, THINK_CLOSE) if not final else 0
            out = b[: len(b) - keep]
            if not final:  # newlines just before </think> are not part of the reasoning
                out = out.rstrip("\n")
            self.buf = b[len(out) :]
            return [self._reason(out)] if out else []
        if self.mode == "text":
            if self._after_think:
                b = self.buf = b.lstrip("\n")
                if not b:
                    return []
                self._after_think = False
            i = b.find(OPEN)
            if i >= 0:
                self.buf, self.mode = b[i + len(OPEN) :], "call"
                return [self._text(b[:i])] if b[:i] else []
            keep = _partial_suffix(b, OPEN) if not final else 0
            out, self.buf = b[: len(b) - keep], b[len(b) - keep :]
            return [self._text(out)] if out else []
        # call
        i = b.find(CLOSE)
        if i < 0:
            return []
        body, self.buf, self.mode = b[:i], b[i + len(CLOSE) :], "text"
        parsed = parse_calls(body, self.fmt)
        if parsed is None:
            self.bad = True
            return [self._text(OPEN + body + CLOSE)]
        events: list[StreamEvent] = []
        for name, arguments in parsed:
            call = ToolCall(new_call_id(), name, arguments)
            self.calls.append(call)
            events += call_deltas(len(self.calls) - 1, call)
        return events

    def _reason(self, s: str) -> ReasoningDelta:
        self.reasoning_parts.append(s)
        return ReasoningDelta(s)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
