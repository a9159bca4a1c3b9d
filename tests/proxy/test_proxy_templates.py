"""The proxy serving published chat templates: prompts are the template's, completions are
parsed in the family's format (streamed and not), and a tool round trip stays one segment.

Scripted completions in each family's own format (Qwen3.5 XML after an opened `<think>`,
GLM-4.5 `<arg_key>`, gpt-oss harmony channels ending in `<|call|>`), served by the real
proxy on loopback to the official `openai` client.
"""

from __future__ import annotations

import json

import openai
import pytest

from legorl.engine.scripted import ScriptedEngine
from legorl.proxy.config import ProxyConfig
from legorl.proxy.renderer_choice import make_renderer
from legorl.proxy.server import ProxyServer
from legorl.proxy.template import _args_as_object
from legorl.trajectory import assemble
from tests.helpers.template_util import qwen_tokenizer, standin_tokenizer, template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
CASES = {
    "qwen3.5-35b-a3b.jinja": (
        "look first\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>"
    ),
    "glm-4.5.jinja": (
        "\n<think>look first</think>\n<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls -la"
        "</arg_value>\n</tool_call><|observation|>"
    ),
    "gpt-oss-20b.jinja": (
        "<|channel|>analysis<|message|>look first<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.bash <|constrain|>json<|message|>{"command": "ls -la"}<|call|>'
    ),
}


def _tokenizer(name: str):
    if name.startswith("qwen"):
        return qwen_tokenizer(template(name))
    if name.startswith("gpt-oss"):
        return standin_tokenizer("gptoss_added.json", template(name), "<|return|>")
    return standin_tokenizer("glm45_added.json", template(name), "<|endoftext|>")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", list(CASES))
async def test_family_served_end_to_end(name: str, stream: bool) -> None:
    tok = _tokenizer(name)
    engine = ScriptedEngine([CASES[name]], tok, append_eos=False)
    sid = f"t-{name}-{stream}"
    async with ProxyServer(ProxyConfig(port=0), engine, make_renderer(tok), standalone=True) as srv:
        o = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key=sid, max_retries=0)
        msgs = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "List the files."}]
        for _ in range(2):
            if stream:
                s = await o.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True)
                reasoning, calls = "", {}
                async for ch in s:
                    for c in ch.choices:
                        reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
                        for tc in c.delta.tool_calls or []:
                            slot = calls.setdefault(tc.index, ["", "", ""])
                            slot[0] = tc.id or slot[0]
                            slot[1] += tc.function.name or ""
                            slot[2] += tc.function.arguments or ""
                got = [tuple(v) for _, v in sorted(calls.items())]
            else:
                r = await o.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
                m = r.choices[0].message
                reasoning = (m.model_extra or {}).get("reasoning_content") or ""
                got = [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []]
            assert [(n, json.loads(a)) for _, n, a in got] == [("bash", {"command": "ls -la"})]
            assert reasoning.strip() == "look first"
            cid = got[0][0]
            msgs = [
                *msgs,
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": reasoning,
                    "tool_calls": [
                        {"id": cid, "type": "function", "function": {"name": "bash", "arguments": got[0][2]}}
                    ],
                },
                {"role": "tool", "tool_call_id": cid, "content": "a.py"},
            ]
        turns = srv.close_session(sid)
    assert len(turns) == 2
    first = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "List the files."}]
    ref = tok.apply_chat_template(first, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    assert turns[0].prompt_ids == list(ref["input_ids"] if hasattr(ref, "keys") else ref)
    traj = assemble(turns)
    assert len(traj.segments) == 1, traj.stats  # the template kept the reply: sampled ids spliced


async def test_rewritten_history_is_the_templates_own_and_a_new_segment() -> None:
    """Qwen3.5 after a new user query: the earlier reasoning is gone from the prompt
    (as in deployment) and the trajectory has two segments, each trained on what it saw."""
    name = "qwen3.5-35b-a3b.jinja"
    tok = _tokenizer(name)
    engine = ScriptedEngine(["thinking hard\n</think>\n\nHello!<|im_end|>"], tok, append_eos=False)
    async with ProxyServer(ProxyConfig(port=0), engine, make_renderer(tok), standalone=True) as srv:
        o = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key="rw", max_retries=0)
        msgs = [{"role": "user", "content": "Hi"}]
        r = await o.chat.completions.create(model="m", messages=msgs)
        m = r.choices[0].message
        msgs += [
            {
                "role": "assistant",
                "content": m.content,
                "reasoning_content": (m.model_extra or {}).get("reasoning_content"),
            },
            {"role": "user", "content": "Bye"},
        ]
        await o.chat.completions.create(model="m", messages=msgs)
        turns = srv.close_session("rw")
    prep = [
        {**x, "tool_calls": [_args_as_object(c) for c in x["tool_calls"]]} if x.get("tool_calls") else x for x in msgs
    ]
    ref = tok.apply_chat_template(prep, add_generation_prompt=True, tokenize=True)
    assert turns[1].prompt_ids == list(ref["input_ids"] if hasattr(ref, "keys") else ref)
    assert "thinking hard" not in tok.decode(turns[1].prompt_ids)
    traj = assemble(turns)
    assert len(traj.segments) == 2 and traj.stats.sampled_tokens == sum(len(t.completion_ids) for t in turns)


@pytest.mark.parametrize("name", list(CASES))
async def test_family_in_the_anthropic_and_responses_dialects(name: str) -> None:
    import anthropic

    tok = _tokenizer(name)
    engine = ScriptedEngine([CASES[name]], tok, append_eos=False)
    async with ProxyServer(ProxyConfig(port=0), engine, make_renderer(tok), standalone=True) as srv:
        a = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="an", max_retries=0)
        tools = [{"name": "bash", "description": "Run a command.", "input_schema": TOOLS[0]["function"]["parameters"]}]
        async with a.messages.stream(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "List."}], tools=tools
        ) as s:
            m = await s.get_final_message()
        assert [(b.name, b.input) for b in m.content if b.type == "tool_use"] == [("bash", {"command": "ls -la"})]
        assert "".join(b.thinking for b in m.content if b.type == "thinking").strip() == "look first"
        o = openai.AsyncOpenAI(base_url=f"{srv.base_url}/s/rs/v1", api_key="x", max_retries=0)
        r = None
        async for ev in await o.responses.create(
            model="m",
            input="List.",
            stream=True,
            tools=[
                {
                    "type": "function",
                    "name": "bash",
                    "description": "Run a command.",
                    "parameters": TOOLS[0]["function"]["parameters"],
                }
            ],
        ):
            if ev.type == "response.completed":
                r = ev.response
        assert r is not None
        assert [(i.name, json.loads(i.arguments)) for i in r.output if i.type == "function_call"] == [
            ("bash", {"command": "ls -la"})
        ]


async def test_a_request_the_template_refuses_is_a_400_with_its_reason() -> None:
    """gpt-oss's template needs a tool description: a 400 naming the template's reason,
    not a 500 (the harness sent something this model's template cannot render)."""
    name = "gpt-oss-20b.jinja"
    tok = _tokenizer(name)
    async with ProxyServer(ProxyConfig(port=0), ScriptedEngine(["x"], tok), make_renderer(tok), standalone=True) as srv:
        o = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key="bad", max_retries=0)
        nodesc = [{"type": "function", "function": {"name": "bash", "parameters": TOOLS[0]["function"]["parameters"]}}]
        with pytest.raises(openai.BadRequestError, match="its chat template cannot render tool definitions"):
            await o.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=nodesc)
