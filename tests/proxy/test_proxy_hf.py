"""The proxy in front of the real `hf` engine (tiny random-weight Qwen3, CPU).

Random weights write arbitrary tokens — special tokens, half tool-call tags, broken UTF-8
— which is exactly what must not break the proxy: in every dialect, streamed or not, the
client's view must equal the decoding of the recorded ids, the recorded ids and logprobs
must be the engine's, usage must be the true counts, and replaying the answer (plus a
tool exchange written by the client) must re-render to the sampled ids.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator

import anthropic
import openai
import pytest

from legorl.engine.hf import HFEngine
from legorl.proxy.server import ProxyServer
from legorl.trajectory import assemble
from tests.helpers.proxy_util import canonical, check_turn, spied_proxy, tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
HISTORY_CALL = {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}


@pytest.fixture(scope="module")
def hf() -> Iterator[HFEngine]:
    seed = int(os.environ.get("LEGORL_TEST_SEED", "0"))  # other seeds: other random completions
    engine = HFEngine("tiny-qwen3", tokenizer(), seed=seed, num_threads=1)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture
async def proxy(hf: HFEngine):
    async with spied_proxy(hf, max_tokens=24, standalone=True) as srv:
        yield srv


def _check_session(srv: ProxyServer, sid: str, views: list[tuple]) -> None:
    turns = srv.close_session(sid)
    assert len(turns) == len(views)
    for turn, (view, usage) in zip(turns, views, strict=True):
        check_turn(turn, srv.spy, view, usage)
    traj = assemble(turns)
    assert len(traj.segments) == 1, traj.stats


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat_with_hf(proxy: ProxyServer, stream: bool) -> None:
    sid = f"hf-oa-{stream}"
    o = openai.AsyncOpenAI(base_url=proxy.base_url + "/v1", api_key=sid, max_retries=0)
    msgs = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "", "tool_calls": [HISTORY_CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "a.py b.py"},
    ]
    views = []
    for k in range(2):
        if stream:
            s = await o.chat.completions.create(
                model="p", messages=msgs, tools=TOOLS, stream=True, stream_options={"include_usage": True}
            )
            content, reasoning, calls, usage = "", "", {}, None
            async for ch in s:
                if ch.usage:
                    usage = (ch.usage.prompt_tokens, ch.usage.completion_tokens)
                for c in ch.choices:
                    content += c.delta.content or ""
                    reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
                    for tc in c.delta.tool_calls or []:
                        slot = calls.setdefault(tc.index, ["", "", ""])
                        slot[0] = tc.id or slot[0]
                        slot[1] += tc.function.name or ""
                        slot[2] += tc.function.arguments or ""
            tool_calls = [tuple(v) for _, v in sorted(calls.items())]
        else:
            r = await o.chat.completions.create(model="p", messages=msgs, tools=TOOLS)
            m = r.choices[0].message
            content, reasoning = m.content or "", (m.model_extra or {}).get("reasoning_content") or ""
            tool_calls = [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []]
            usage = (r.usage.prompt_tokens, r.usage.completion_tokens)
        views.append((canonical(content, reasoning or None, [(n, a) for _, n, a in tool_calls]), usage))
        msgs.append(
            {
                "role": "assistant",
                "content": content,
                "reasoning_content": reasoning or None,
                **(
                    {
                        "tool_calls": [
                            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                            for i, n, a in tool_calls
                        ]
                    }
                    if tool_calls
                    else {}
                ),
            }
        )
        msgs += [{"role": "tool", "tool_call_id": i, "content": "ok"} for i, _, _ in tool_calls]
        msgs.append({"role": "user", "content": f"continue {k}"})
    _check_session(proxy, sid, views)


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_with_hf(proxy: ProxyServer, stream: bool) -> None:
    sid = f"hf-an-{stream}"
    a = anthropic.AsyncAnthropic(base_url=proxy.base_url, api_key=sid, max_retries=0)
    msgs = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t0", "name": "bash", "input": {"command": "ls"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t0", "content": "a.py b.py"}]},
    ]
    tools = [{"name": "bash", "description": "Run a command.", "input_schema": TOOLS[0]["function"]["parameters"]}]
    views = []
    for k in range(2):
        kw = dict(model="m", max_tokens=100, system="You are a coding agent.", messages=msgs, tools=tools)
        if stream:
            async with a.messages.stream(**kw) as s:
                m = await s.get_final_message()
        else:
            m = await a.messages.create(**kw)
        text = "".join(b.text for b in m.content if b.type == "text")
        thinking = "".join(b.thinking for b in m.content if b.type == "thinking")
        calls = [(b.name, b.input) for b in m.content if b.type == "tool_use"]
        views.append((canonical(text, thinking or None, calls), (m.usage.input_tokens, m.usage.output_tokens)))
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "ok"} for b in m.content if b.type == "tool_use"
        ]
        msgs.append({"role": "user", "content": [*results, {"type": "text", "text": f"continue {k}"}]})
    _check_session(proxy, sid, views)


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_with_hf(proxy: ProxyServer, stream: bool) -> None:
    sid = f"hf-rs-{stream}"
    o = openai.AsyncOpenAI(base_url=f"{proxy.base_url}/s/{sid}/v1", api_key="x", max_retries=0)
    items = [
        {"role": "user", "content": "list files"},
        {"type": "function_call", "call_id": "c0", "name": "bash", "arguments": '{"command": "ls"}'},
        {"type": "function_call_output", "call_id": "c0", "output": "a.py b.py"},
    ]
    tools = [{"type": "function", "name": "bash", "parameters": TOOLS[0]["function"]["parameters"]}]
    views = []
    for k in range(2):
        kw = dict(model="m", input=items, tools=tools, instructions="You are a coding agent.")
        if stream:
            r = None
            async for ev in await o.responses.create(stream=True, **kw):
                if ev.type in ("response.completed", "response.incomplete"):
                    r = ev.response
        else:
            r = await o.responses.create(**kw)
        calls = [x for x in r.output if x.type == "function_call"]
        reasoning = "".join(c.text for x in r.output if x.type == "reasoning" for c in x.content or [])
        views.append(
            (
                canonical(r.output_text, reasoning or None, [(c.name, c.arguments) for c in calls]),
                (r.usage.input_tokens, r.usage.output_tokens),
            )
        )
        items += [x.model_dump(exclude_none=True) for x in r.output]
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls]
        items.append({"role": "user", "content": f"continue {k}"})
    _check_session(proxy, sid, views)


async def test_concurrent_sessions_share_the_batching_engine(proxy: ProxyServer, hf: HFEngine) -> None:
    steps0 = hf.stats["decode_steps"]
    tokens0 = hf.stats["tokens"]

    async def one(i: int) -> int:
        o = openai.AsyncOpenAI(base_url=proxy.base_url + "/v1", api_key=f"c{i}", max_retries=0)
        r = await o.chat.completions.create(model="p", messages=[{"role": "user", "content": f"task {i}"}])
        return r.usage.completion_tokens

    counts = await asyncio.gather(*[one(i) for i in range(8)])
    assert sum(counts) == hf.stats["tokens"] - tokens0
    assert hf.stats["decode_steps"] - steps0 < sum(counts)  # rows were decoded together
    for i in range(8):
        (turn,) = proxy.close_session(f"c{i}")
        call = proxy.spy.call_for(turn)
        assert json.dumps(turn.logprobs) == json.dumps(call.logprobs)
