"""What a parsed completion is made of: text, reasoning and tool calls, whole
(`ParsedCompletion`) or as stream events. Shared by every completion format's parser
(`toolcalls.py` for the tag formats, `harmony.py` for gpt-oss) and every dialect that
writes them out, so no parser imports another for its types.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON object text


@dataclass
class ParsedCompletion:
    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    format_error: bool = False


@dataclass
class TextDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ToolCallDelta:
    index: int
    id: str
    name: str | None
    arguments: str


StreamEvent = TextDelta | ReasoningDelta | ToolCallDelta


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def call_deltas(idx: int, call: ToolCall, step: int = 16) -> list[StreamEvent]:
    """A finished call as a start delta plus argument pieces."""
    events: list[StreamEvent] = [ToolCallDelta(idx, call.id, call.name, "")]
    for k in range(0, len(call.arguments), step):
        events.append(ToolCallDelta(idx, call.id, None, call.arguments[k : k + step]))
    return events
