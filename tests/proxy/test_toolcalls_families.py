"""Tool-call parsing in each family's own format (GLM-4.5, harmony, think-opened prompts,
SmolLM2's JSON list), whole and streamed."""

from __future__ import annotations

import json
import random

import pytest

from legorl.proxy.completion import ReasoningDelta, TextDelta
from legorl.proxy.toolcalls import StreamParser, parse_completion

GLM = (
    "\n<think>plan it</think>\nI will look.\n<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls "
    "-la</arg_value>\n"
    "<arg_key>timeout</arg_key>\n<arg_value>30</arg_value>\n</tool_call>"
)
HARMONY_CALL = (
    "<|channel|>analysis<|message|>plan it<|end|><|start|>assistant<|channel|>commentary to=functions.bash "
    '<|constrain|>json<|message|>{"command": "ls -la", "timeout": 30}'
)
HARMONY_HISTORY = (
    "<|channel|>analysis<|message|>plan it<|end|><|start|>assistant to=functions.bash<|channel|>"
    'commentary json<|message|>{"command": "ls -la", "timeout": 30}'
)
HARMONY_FINAL = "<|channel|>analysis<|message|>plan it<|end|><|start|>assistant<|channel|>final<|message|>All done."
QWEN35 = (
    "plan it\n</think>\n\nI will look.\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n"
    "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>"
)
SMOL = (
    '<tool_call>[{"name": "bash", "arguments": {"command": "ls -la", "timeout": 30}}, {"name": "pwd", '
    '"arguments": {}}]</tool_call>'
)

CASES = [
    ("glm45", GLM, False),
    ("harmony", HARMONY_CALL, False),
    ("harmony", HARMONY_HISTORY, False),
    ("qwen3_coder", QWEN35, True),
]


@pytest.mark.parametrize("fmt,text,opened", CASES)
def test_family_call_and_reasoning(fmt: str, text: str, opened: bool) -> None:
    p = parse_completion(text, fmt, opened)
    assert not p.format_error and p.reasoning == "plan it"
    assert [(c.name, json.loads(c.arguments)) for c in p.tool_calls] == [("bash", {"command": "ls -la", "timeout": 30})]
    assert p.content in ("I will look.", "")


def test_harmony_final_is_content() -> None:
    p = parse_completion(HARMONY_FINAL, "harmony")
    assert (p.reasoning, p.content, p.tool_calls, p.format_error) == ("plan it", "All done.", [], False)


def test_json_list_is_several_calls() -> None:
    p = parse_completion(SMOL)
    assert [c.name for c in p.tool_calls] == ["bash", "pwd"] and not p.format_error


@pytest.mark.parametrize(
    "fmt,text",
    [
        ("glm45", "<tool_call>bash\n<arg_key>command</arg_key>\n</tool_call>"),  # key without value
        ("harmony", "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{not json"),
        ("harmony", "no header at all"),
    ],
)
def test_malformed_family_call_is_text_and_flagged(fmt: str, text: str) -> None:
    p = parse_completion(text, fmt)
    assert p.format_error and not p.tool_calls


def test_unclosed_reasoning_of_an_opened_prompt_is_reasoning() -> None:
    p = parse_completion("still thinking about it", "hermes", starts_in_reasoning=True)
    assert p.reasoning == "still thinking about it" and p.content == ""


@pytest.mark.parametrize("fmt,text,opened", [*CASES, ("harmony", HARMONY_FINAL, False), ("hermes", SMOL, False)])
@pytest.mark.parametrize("seed", range(5))
def test_stream_equals_whole(fmt: str, text: str, opened: bool, seed: int) -> None:
    rng = random.Random(seed)
    sp = StreamParser(fmt, opened)
    events, i = [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        events += sp.feed(text[i : i + n])
        i += n
    tail, parsed = sp.finish()
    events += tail
    whole = parse_completion(text, fmt, opened)
    assert (parsed.content, parsed.reasoning, parsed.format_error) == (
        whole.content,
        whole.reasoning,
        whole.format_error,
    )
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments) for c in whole.tool_calls]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)).strip() == whole.content.strip()
    streamed_reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert streamed_reasoning.strip("\n") == (whole.reasoning or "")
