"""Tool-call parsing, whole and streamed, in both formats; malformed calls become text."""

from __future__ import annotations

import json
import random

import pytest

from legorl.proxy.completion import ReasoningDelta, TextDelta, ToolCallDelta
from legorl.proxy.toolcalls import StreamParser, parse_completion

HERMES = (
    "<think>\nplan it\n</think>\n\nI will run two commands.\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "read", "arguments": {"path": "a.py", "limit": 5}}\n</tool_call>'
)
CODER = (
    "Checking.\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n"
    "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>"
)


def test_hermes_parallel_calls_and_reasoning() -> None:
    p = parse_completion(HERMES)
    assert p.reasoning == "plan it" and p.content == "I will run two commands." and not p.format_error
    assert [(c.name, json.loads(c.arguments)) for c in p.tool_calls] == [
        ("bash", {"command": "ls -la"}),
        ("read", {"path": "a.py", "limit": 5}),
    ]


def test_qwen3_coder_xml() -> None:
    p = parse_completion(CODER, "qwen3_coder")
    assert p.content == "Checking." and json.loads(p.tool_calls[0].arguments) == {"command": "ls -la", "timeout": 30}


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"</tool_call>',  # bad JSON
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        'before <tool_call>\n{"name": "bash", "arguments": {}}',  # never closed
    ],
)
def test_malformed_call_is_text_and_flagged(text: str) -> None:
    p = parse_completion(text)
    assert p.format_error and not p.tool_calls and p.content == text


@pytest.mark.parametrize(
    "fmt,text",
    [
        ("hermes", HERMES),
        ("qwen3_coder", CODER),
        ("hermes", "plain <tool answer"),
        ("hermes", "<tool_call>\n{bad}\n</tool_call> tail"),
    ],
)
@pytest.mark.parametrize("seed", range(5))
def test_stream_equals_whole(fmt: str, text: str, seed: int) -> None:
    rng = random.Random(seed)
    sp = StreamParser(fmt)
    events, i = [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        events += sp.feed(text[i : i + n])
        i += n
    tail, parsed = sp.finish()
    events += tail
    whole = parse_completion(text, fmt)
    assert parsed.content == whole.content and parsed.reasoning == whole.reasoning
    assert parsed.format_error == whole.format_error
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    streamed = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert streamed.strip() == whole.content.strip()
    assert not streamed.startswith("\n")  # newlines after </think> are stripped in any chunking
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == (whole.reasoning or "")
    for k, c in enumerate(parsed.tool_calls):
        deltas = [e for e in events if isinstance(e, ToolCallDelta) and e.index == k]
        assert deltas[0].name == c.name and "".join(d.arguments for d in deltas) == c.arguments
