"""The incremental renderer must equal the chat template, token for token."""

from __future__ import annotations

import random

import pytest

from legorl.models import load_tokenizer
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.renderer import ChatRequest, Renderer, RenderState
from legorl.proxy.renderer_choice import make_renderer
from legorl.proxy.template import TemplateRenderer
from legorl.proxy.toolcalls import parse_completion
from tests.helpers.conversations import random_conversation

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Édit a file ✓",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-qwen3")


@pytest.mark.parametrize("seed", range(40))
def test_render_matches_chat_template(tok, seed: int) -> None:
    rng = random.Random(seed)
    msgs = random_conversation(rng)
    tools = TOOLS if rng.random() < 0.6 else []
    r = ChatMLRenderer(tok)
    ids = r.render(ChatRequest(msgs, tools))
    ref = tok.apply_chat_template(msgs, tools=tools or None, tokenize=False, add_generation_prompt=True)
    assert ids == tok(ref, add_special_tokens=False)["input_ids"]
    assert r.render(ChatRequest(msgs, tools)) == ids  # cached path gives the same ids


def test_continue_final_message(tok) -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Partial answer"}]
    ids = ChatMLRenderer(tok).render(ChatRequest(msgs, [], add_generation_prompt=False))
    assert tok.decode(ids).endswith("<|im_start|>assistant\nPartial answer")


def test_splice_keeps_sampled_ids_under_reserialisation(tok) -> None:
    r = ChatMLRenderer(tok)
    state = RenderState()
    msgs = [{"role": "user", "content": "list files"}]
    prompt = r.render(ChatRequest(msgs, TOOLS), state)
    # a non-canonical tokenisation the policy might sample: one token per character
    text = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    sampled = [i for ch in text for i in r.encode(ch)] + [r.im_end]
    parsed = parse_completion(text)
    state.remember(sampled, parsed)
    # the harness replays it re-serialised compactly (OpenCode) and adds the tool result
    msgs2 = msgs + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "x", "content": "a.py"},
    ]
    prompt2 = r.render(ChatRequest(msgs2, TOOLS), state)
    assert prompt2[: len(prompt) + len(sampled)] == prompt + sampled
    # without the session state the canonical rendering is used and the prefix diverges
    assert r.render(ChatRequest(msgs2, TOOLS))[: len(prompt) + len(sampled)] != prompt + sampled


def test_both_renderers_are_the_protocol_the_proxy_is_typed_with(tok) -> None:
    """The proxy's seams take a `Renderer`; each implementation has every member it names,
    and an object missing one (here `count`) is not one."""
    for r in (ChatMLRenderer(tok), TemplateRenderer(tok), make_renderer(tok)):
        assert isinstance(r, Renderer), type(r).__name__
        assert r.render(ChatRequest([{"role": "user", "content": "hi"}])) == r.encode(
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        )

    class NoCount:
        tokenizer, eos_ids, tool_format, starts_in_reasoning = tok, {0}, "hermes", False
        render = encode = decode = staticmethod(lambda *_: [])

    assert not isinstance(NoCount(), Renderer)
