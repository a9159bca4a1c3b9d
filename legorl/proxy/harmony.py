"""gpt-oss's harmony format: completion text → reasoning, content and tool calls.

A harmony completion is a run of messages, each `[<|start|>assistant]HEADER<|message|>BODY`
ended by `<|end|>` (more follows), `<|call|>` (a tool call) or `<|return|>` (done); the
first message's `<|start|>assistant` is the generation prompt, and the engine strips the
final stop token. The header names the channel and, for a tool call, the recipient —
where the model writes it (`<|channel|>commentary to=functions.NAME <|constrain|>json`)
or where the chat template writes history (`to=functions.NAME<|channel|>commentary json`):
- channel `analysis` → reasoning (several analysis messages are joined by a newline);
- a recipient `functions.NAME` → a tool call whose body is the JSON arguments;
- channel `final`, or `commentary` without a recipient (a preamble) → content.
A message without `<|message|>`, or a call whose body is not a JSON object, becomes
content text and flags `format_error`, as in the other formats.

Streaming holds a message until its header is complete, then streams analysis as
reasoning and final/preamble text as content; a tool call is emitted when its message ends.
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

START, MESSAGE = "<|start|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


def _header(header: str) -> tuple[str | None, str | None]:
    ch = _CHANNEL.search(header)
    to = _RECIPIENT.search(header)
    return (ch.group(1) if ch else None), (to.group(1) if to else None)


def _call(recipient: str, body: str) -> ToolCall | None:
    name = recipient.removeprefix("functions.")
    try:
        args = json.loads(body)
    except json.JSONDecodeError:
        return None
    if isinstance(args, str):  # a template that double-encodes string arguments
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict) or not name:
        return None
    return ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False))


def _split_messages(text: str) -> list[str]:
    """Messages of a completion, each HEADER<|message|>BODY without its end token."""
    out: list[str] = []
    for part in text.split(START):
        part = part.removeprefix("assistant")
        for end in ENDS:
            if part.endswith(end):
                part = part[: -len(end)]
                break
        if part:
            out.append(part)
    return out


def parse_harmony(text: str) -> ParsedCompletion:
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[ToolCall] = []
    bad = False
    for msg in _split_messages(text):
        header, sep, body = msg.partition(MESSAGE)
        if not sep:
            content.append(msg)
            bad = True
            continue
        channel, recipient = _header(header)
        if recipient is not None and recipient != "assistant":
            call = _call(recipient, body)
            if call is None:
                content.append(msg)
                bad = True
            else:
                calls.append(call)
        elif channel == "analysis":
            reasoning.append(body)
        else:
            content.append(body)
    return ParsedCompletion(
        "".join(content).strip() if calls else "".join(content), "\n".join(reasoning) if reasoning else None, calls, bad
    )


class HarmonyStreamParser:
    """Incremental `parse_harmony` with the `StreamParser` interface."""

    def __init__(self) -> None:
        self.buf = ""
        self.header: str | None = None  # the current message's header once complete
        self.body = ""  # the current message's body so far
        self.emitted = 0  # how much of `body` was streamed
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: list[ToolCall] = []
        self.bad = False
        self._reason_open = False

    def feed(self, delta: str) -> list[StreamEvent]:
        self.buf += delta
        return self._drain(final=False)

    def finish(self) -> tuple[list[StreamEvent], ParsedCompletion]:
        events = self._drain(final=True)
        if self.header is None and self.buf.strip(START).removeprefix("assistant"):
            leftover = self.buf
            self.content.append(leftover)
            self.bad = True
            events.append(TextDelta(leftover))
        elif self.header is not None:
            events += self._close()
        self.buf = ""
        calls = self.calls
        content = "".join(self.content)
        return events, ParsedCompletion(
            content.strip() if calls else content,
            "\n".join(self.reasoning) if self.reasoning else None,
            calls,
            self.bad,
        )

    def _drain(self, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while True:
            if self.header is None:
                buf = self.buf
                buf = buf.removeprefix(START)
                buf = buf.removeprefix("assistant")
                i = buf.find(MESSAGE)
                if i < 0:
                    return events
                self.header, self.buf, self.body, self.emitted = buf[:i], buf[i + len(MESSAGE) :], "", 0
                continue
            ends = [(self.buf.find(e), e) for e in ENDS if e in self.buf]
            if ends:
                at, end = min(ends)
                self.body += self.buf[:at]
                self.buf = self.buf[at + len(end) :]
                events += self._close()
                continue
            # no end yet: stream what cannot be the start of an end/start token
            hold = 0 if final else _partial(self.buf)
            self.body += self.buf[: len(self.buf) - hold]
            self.buf = self.buf[len(self.buf) - hold :]
            events += self._stream()
            return events

    def _kind(self) -> str:
        channel, recipient = _header(self.header or "")
        if recipient is not None and recipient != "assistant":
            return "call"
        return "reasoning" if channel == "analysis" else "text"

    def _stream(self) -> list[StreamEvent]:
        kind = self._kind()
        piece = self.body[self.emitted :]
        if not piece or kind == "call":
            return []
        self.emitted = len(self.body)
        if kind == "reasoning":
            if self._reason_open:
                self.reasoning[-1] += piece
            else:
                self.reasoning.append(piece)
                self._reason_open = True
            return [ReasoningDelta(piece)]
        self.content.append(piece)
        return [TextDelta(piece)]

    def _close(self) -> list[StreamEvent]:
        kind = self._kind()
        events: list[StreamEvent] = []
        if kind == "call":
            _, recipient = _header(self.header or "")
            call = _call(recipient or "", self.body)
            if call is None:
                text = (self.header or "") + MESSAGE + self.body
                self.content.append(text)
                self.bad = True
                events.append(TextDelta(text))
            else:
                self.calls.append(call)
                events += call_deltas(len(self.calls) - 1, call)
        else:
            events += self._stream()
            if kind == "reasoning" and not self._reason_open:
                self.reasoning.append("")
        self._reason_open = False
        self.header, self.body, self.emitted = None, "", 0
        return events


def _partial(text: str) -> int:
    """Length of the longest suffix of `text` that may begin an end or start token."""
    i = text.rfind("<|")
    if i < 0:
        return 1 if text.endswith("<") else 0
    tail = text[i:]
    return len(tail) if any(t.startswith(tail) for t in (*ENDS, START)) else 0
