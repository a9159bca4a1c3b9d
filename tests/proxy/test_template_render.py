"""Rendering with the model's own chat template equals `apply_chat_template`, token for token.

Test data: the published templates in `fixtures/chat_templates/` (Qwen3-30B-A3B, Qwen3-4B-
Thinking-2507, Qwen3.5-35B-A3B, Qwen3-Coder, gpt-oss-20b, GLM-4.5) with the tokenizers of
`template_util.py`, the bundled template, and SmolLM2-135M-Instruct's own (in its test module).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from legorl.models import load_tokenizer
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.renderer import ChatRequest, RenderState
from legorl.proxy.renderer_choice import make_renderer
from legorl.proxy.template import TemplateError, TemplateRenderer, _args_as_object
from legorl.trajectory import extends
from tests.helpers.conversations import random_conversation
from tests.helpers.template_util import qwen_tokenizer, standin_tokenizer, template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Édit a file ✓",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "new": {"type": "string"}}},
        },
    },
]
QWEN = [
    "qwen2.5-7b-instruct.jinja",
    "qwen3-30b-a3b.jinja",
    "qwen3-4b-thinking-2507.jinja",
    "qwen3.5-35b-a3b.jinja",
    "qwen3-coder.jinja",
]
FAMILIES = [*QWEN, "gpt-oss-20b.jinja", "glm-4.5.jinja"]


@pytest.fixture(scope="module")
def qwen_tok():
    return qwen_tokenizer(template("qwen3-30b-a3b.jinja"))


@pytest.fixture(scope="module")
def toks(qwen_tok) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in QWEN:
        out[name] = qwen_tok
    out["gpt-oss-20b.jinja"] = standin_tokenizer("gptoss_added.json", template("gpt-oss-20b.jinja"), "<|return|>")
    out["glm-4.5.jinja"] = standin_tokenizer("glm45_added.json", template("glm-4.5.jinja"), "<|endoftext|>")
    return out


def _reference(tok: Any, name: str, msgs: list[dict], tools: list[dict], gen: bool = True) -> list[int]:
    # What the proxy hands the template: tool-call arguments as objects (as vLLM does).
    prep = [
        {**m, "tool_calls": [_args_as_object(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in msgs
    ]
    out = tok.apply_chat_template(
        prep, tools=tools or None, add_generation_prompt=gen, tokenize=True, chat_template=template(name)
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _conversation(rng: random.Random, name: str) -> list[dict]:
    """A random agent conversation valid for the template (gpt-oss: one call per message,
    content or reasoning but not both with a call; every template: a user query first)."""
    words = ["def", "foo", "(x):", "\n", "  ", "return", "x+1", "héllo", "😀", "{}", '"q"', "\t", "ls -la", "12345"]

    def text() -> str:
        return (
            "".join(rng.choice(words) + rng.choice([" ", "", "\n"]) for _ in range(rng.randint(1, 12))).strip() or "ok"
        )

    harmony = name.startswith("gpt-oss")
    msgs: list[dict] = []
    if rng.random() < 0.8:
        msgs.append({"role": "system", "content": text()})
    msgs.append({"role": "user", "content": text()})
    for _ in range(rng.randint(0, 4)):
        n = 1 if harmony else rng.randint(0, 2)
        calls = [
            {
                "id": f"c{len(msgs)}_{k}",
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": rng.choice(["ls", "pwd", "cat a"])})},
            }
            for k in range(n if rng.random() < 0.7 else 0)
        ]
        m: dict[str, Any] = {"role": "assistant", "content": text()}
        if rng.random() < 0.5:
            m["reasoning_content"] = text()
            if harmony and calls:
                m["content"] = ""
        if calls:
            m["tool_calls"] = calls
        msgs.append(m)
        for c in calls:
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": text()})
        if not calls:
            msgs.append({"role": "user", "content": text()})
    return msgs


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("seed", range(12))
def test_template_renderer_equals_apply_chat_template(toks, name: str, seed: int) -> None:
    rng = random.Random(seed)
    tok = toks[name]
    r = TemplateRenderer(tok, chat_template=template(name))
    msgs = _conversation(rng, name)
    tools = TOOLS if rng.random() < 0.7 else []
    ids = r.render(ChatRequest(msgs, tools))
    assert ids == _reference(tok, name, msgs, tools)
    assert r.render(ChatRequest(msgs, tools)) == ids  # the piece cache gives the same ids


@pytest.mark.parametrize(
    "name,family,opens_think",
    [
        ("qwen2.5-7b-instruct.jinja", "hermes", False),
        ("qwen3-30b-a3b.jinja", "hermes", False),
        ("qwen3-4b-thinking-2507.jinja", "hermes", True),
        ("qwen3.5-35b-a3b.jinja", "qwen3_coder", True),
        ("qwen3-coder.jinja", "qwen3_coder", False),
        ("gpt-oss-20b.jinja", "harmony", False),
        ("glm-4.5.jinja", "glm45", False),
    ],
)
def test_family_is_read_from_the_template(toks, name: str, family: str, opens_think: bool) -> None:
    r = TemplateRenderer(toks[name], chat_template=template(name))
    assert (r.tool_format, r.starts_in_reasoning) == (family, opens_think)
    assert r._chunked  # piece-wise tokenisation verified exact for this tokenizer


@pytest.mark.parametrize("seed", range(20))
def test_bundled_template_same_ids_as_the_fast_renderer(seed: int) -> None:
    tok = load_tokenizer("tiny-qwen3")
    rng = random.Random(seed)
    msgs = random_conversation(rng)
    tools = TOOLS if rng.random() < 0.6 else []
    assert isinstance(make_renderer(tok), ChatMLRenderer)  # the bundled models keep today's renderer
    # the template renderer passes arguments as objects (the fast one writes strings verbatim)
    obj_msgs = [
        {**m, "tool_calls": [_args_as_object(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in msgs
    ]
    assert TemplateRenderer(tok).render(ChatRequest(obj_msgs, tools)) == ChatMLRenderer(tok).render(
        ChatRequest(obj_msgs, tools)
    )


def _turn(r: TemplateRenderer, state: RenderState, msgs: list[dict], tools: list[dict], completion: str):
    """One policy turn: render, 'sample' `completion` (ids spelled one char at a time, a
    tokenisation the template would never produce), remember it."""
    prompt = r.render(ChatRequest(msgs, tools), state)
    body, stop = completion.rsplit("<", 1)
    stop = "<" + stop
    sampled = [i for ch in body for i in r.encode(ch)] + r.encode(stop)
    parsed = r.parse(body)
    state.remember(sampled, parsed, prompt)
    return prompt, sampled, parsed


@pytest.mark.parametrize(
    "name,completion,call_args",
    [
        (
            "qwen3-30b-a3b.jinja",
            '<think>\nlook first\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {"command":"ls"}}\n'
            "</tool_call><|im_end|>",
            {"command": "ls"},
        ),
        (
            "qwen3.5-35b-a3b.jinja",
            (
                "look first\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n"
                "</function>\n"
                "</tool_call><|im_end|>"
            ),
            {"command": "ls"},
        ),
        (
            "glm-4.5.jinja",
            (
                "\n<think>look first</think>\n<tool_call>bash\n<arg_key>command</arg_key>\n"
                "<arg_value>ls</arg_value>\n</tool_call><|observation|>"
            ),
            {"command": "ls"},
        ),
        (
            "gpt-oss-20b.jinja",
            (
                "<|channel|>analysis<|message|>look first<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.bash <|constrain|>json<|message|>{"command":"ls"}<|call|>'
            ),
            {"command": "ls"},
        ),
    ],
)
def test_agent_loop_splices_sampled_ids(toks, name: str, completion: str, call_args: dict) -> None:
    """A tool round trip whose template keeps the reply: the next prompt extends
    prompt + sampled ids exactly (one segment), though the harness re-serialised the call."""
    tok = toks[name]
    r = TemplateRenderer(tok, chat_template=template(name))
    state = RenderState()
    msgs = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "List the files."}]
    prompt, sampled, parsed = _turn(r, state, msgs, TOOLS, completion)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("bash", call_args)]
    assert parsed.reasoning == "look first"
    echo = {
        "role": "assistant",
        "content": parsed.content,
        "reasoning_content": parsed.reasoning,
        "tool_calls": [
            {
                "id": "x1",
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps(call_args, separators=(",", ":"))},
            }
        ],
    }
    msgs2 = [*msgs, echo, {"role": "tool", "tool_call_id": "x1", "content": "a.py"}]
    nxt = r.render(ChatRequest(msgs2, TOOLS), state)
    assert extends(nxt, prompt, sampled)
    # the rest is the template's own tokens: equal to the canonical rendering's tail
    canon = _reference(tok, name, msgs2, TOOLS)
    assert r.decode(nxt).endswith(r.decode(canon[-12:]))


def test_dropped_reasoning_starts_a_new_segment(toks) -> None:
    """Qwen3.5 drops reasoning of replies before the last user query: after a new user
    message the prompt is the template's own rendering (what deployment shows), which no
    longer extends the previous turn — the documented new-segment rule."""
    name = "qwen3.5-35b-a3b.jinja"
    tok = toks[name]
    r = TemplateRenderer(tok, chat_template=template(name))
    state = RenderState()
    msgs = [{"role": "user", "content": "Hi"}]
    prompt, sampled, parsed = _turn(r, state, msgs, [], "I should greet\n</think>\n\nHello!<|im_end|>")
    assert parsed.reasoning == "I should greet" and parsed.content == "Hello!"
    msgs2 = [
        *msgs,
        {"role": "assistant", "content": "Hello!", "reasoning_content": "I should greet"},
        {"role": "user", "content": "Bye"},
    ]
    nxt = r.render(ChatRequest(msgs2, []), state)
    assert not extends(nxt, prompt, sampled)
    assert nxt == _reference(tok, name, msgs2, [])
    assert "I should greet" not in r.decode(nxt)


def test_harness_drops_reasoning_then_no_splice(toks) -> None:
    """The harness did not send the reasoning back: the template's reply differs from the
    sampled one, so the canonical rendering is used (new segment), never a silent splice."""
    name = "qwen3-30b-a3b.jinja"
    tok = toks[name]
    r = TemplateRenderer(tok, chat_template=template(name))
    state = RenderState()
    msgs = [{"role": "user", "content": "List."}]
    prompt, sampled, _ = _turn(
        r,
        state,
        msgs,
        TOOLS,
        "<think>\nhm\n</think>\n\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>',
    )
    msgs2 = [
        *msgs,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "x", "content": "a.py"},
    ]
    nxt = r.render(ChatRequest(msgs2, TOOLS), state)
    assert not extends(nxt, prompt, sampled) and nxt == _reference(tok, name, msgs2, TOOLS)


def test_continue_final_message(toks) -> None:
    name = "qwen3-30b-a3b.jinja"
    tok = toks[name]
    r = TemplateRenderer(tok, chat_template=template(name))
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Partial answer"}]
    ids = r.render(ChatRequest(msgs, [], add_generation_prompt=False))
    assert r.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nPartial answer")
    ref = tok.apply_chat_template(msgs, continue_final_message=True, tokenize=True, chat_template=template(name))
    assert ids == list(ref["input_ids"] if hasattr(ref, "keys") else ref)


@pytest.mark.parametrize(
    "source,words",
    [
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "does not append a generation prompt"),
        (
            (
                "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if tools %}{{ tools | tojson "
                "}}{% endif %}"
                "{% if add_generation_prompt %}assistant:{% endif %}"
            ),
            "none of the tool-call formats",
        ),
    ],
)
def test_unknown_template_shape_is_refused(source: str, words: str) -> None:
    tok = load_tokenizer("tiny-qwen3")
    with pytest.raises(TemplateError, match=words):
        TemplateRenderer(tok, chat_template=source)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("seed", range(4))
def test_growing_conversation_reuses_prefix_ids_exactly(toks, name: str, seed: int) -> None:
    """One session rendering a conversation as it grows (and once shrunk, like a
    compaction): each prompt equals `apply_chat_template` although only new pieces are
    tokenised, and a repeated request gives the same ids."""
    rng = random.Random(100 + seed)
    tok = toks[name]
    r = TemplateRenderer(tok, chat_template=template(name))
    msgs = _conversation(rng, name)
    state = RenderState()
    cuts = [
        k
        for k in range(2, len(msgs) + 1)
        if msgs[k - 1]["role"] in ("user", "tool") and (k == len(msgs) or msgs[k]["role"] != "tool")
    ]
    for k in [*cuts, *cuts[:1]]:
        req = ChatRequest(msgs[:k], TOOLS)
        ids = r.render(req, state)
        assert ids == _reference(tok, name, msgs[:k], TOOLS), k
        assert r.render(req, state) == ids


@pytest.mark.parametrize("name", FAMILIES)
def test_doctor_round_trip_per_family(toks, name: str) -> None:
    from legorl.proxy.renderer_choice import round_trip

    tok = toks[name]
    saved = tok.chat_template
    tok.chat_template = template(name)
    try:
        assert "ids equal" in round_trip(tok)
    finally:
        tok.chat_template = saved


def test_doctor_round_trip_refuses_an_unknown_shape() -> None:
    from legorl.proxy.renderer_choice import round_trip

    tok = load_tokenizer("tiny-qwen3")
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(TemplateError, match="refuses to guess"):
        round_trip(tok)


def test_doctor_refuses_an_unknown_template(tmp_path) -> None:
    from legorl.loop.config import RunConfig
    from legorl.monitor.doctor import run_one
    from legorl.proxy.checks import template_check

    tok = load_tokenizer("tiny-qwen3")
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    cfg = RunConfig.model_validate(
        {
            "harness": {"name": "command", "command_file": "/bin/true"},
            "engine": {"kind": "scripted", "model": str(tmp_path), "scripted_completions": ["x"]},
        }
    )
    res = run_one(template_check(cfg))
    assert not res.ok and "unknown chat template shape" in res.detail and "supported families" in res.fix
