"""All three dialects through real loopback servers and the official clients, with tool
calls round-tripped (the model calls a tool, the client sends the result, the next turn
continues), streaming and not, against the scripted engine.

For every turn: the client's view (text, reasoning, tool calls) equals the decoding of the
recorded completion ids, recorded logprobs equal the engine's, usage is the true token
counts, and the session assembles into ONE segment — i.e. the harness's replayed history
was rendered back to exactly the ids the policy sampled.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from legorl.proxy.server import ProxyServer
from legorl.trajectory import assemble
from tests.helpers.dialect_script import ANTHROPIC_TOOLS, EXPECTED_CALLS, OPENAI_TOOLS, RESPONSES_TOOLS, SCRIPT
from tests.helpers.proxy_util import ProxyScript, canonical, check_turn, tokenizer


@pytest.fixture
def proxy_script() -> ProxyScript:
    return ProxyScript(SCRIPT)


def _finish(srv: ProxyServer, sid: str, views: list[tuple]) -> None:
    turns = srv.close_session(sid)
    assert len(turns) == len(views) == 3
    for turn, (view, usage) in zip(turns, views, strict=True):
        check_turn(turn, srv.spy, view, usage)
        assert not turn.format_error and not turn.side_call
    assert [[(n, a) for n, a in v[0][2]] for v in views] == EXPECTED_CALLS
    traj = assemble(turns)
    assert len(traj.segments) == 1, f"history did not re-render to the sampled ids: {traj.stats}"
    assert traj.stats.sampled_tokens == sum(len(t.completion_ids) for t in turns)


# -- OpenAI Chat Completions ------------------------------------------------------------------
async def _openai_turn(client: openai.AsyncOpenAI, msgs: list[dict], stream: bool) -> tuple[dict, tuple, tuple]:
    if not stream:
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=OPENAI_TOOLS)
        m = r.choices[0].message
        reasoning = (m.model_extra or {}).get("reasoning_content")
        calls = [(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []]
        content, usage = m.content, (r.usage.prompt_tokens, r.usage.completion_tokens)
        assert r.choices[0].finish_reason == ("tool_calls" if calls else "stop")
    else:
        s = await client.chat.completions.create(
            model="policy", messages=msgs, tools=OPENAI_TOOLS, stream=True, stream_options={"include_usage": True}
        )
        content, reasoning, by_index, usage, finish = "", "", {}, None, None
        async for ch in s:
            if ch.usage is not None:
                usage = (ch.usage.prompt_tokens, ch.usage.completion_tokens)
            for choice in ch.choices:
                d = choice.delta
                content += d.content or ""
                reasoning += (d.model_extra or {}).get("reasoning_content") or ""
                for tc in d.tool_calls or []:
                    slot = by_index.setdefault(tc.index, {"id": tc.id, "name": "", "args": ""})
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["args"] += (tc.function.arguments or "") if tc.function else ""
                finish = choice.finish_reason or finish
        calls = [(v["id"], v["name"], v["args"]) for _, v in sorted(by_index.items())]
        assert finish == ("tool_calls" if calls else "stop")
    # OpenCode replays reasoning_content and re-stringifies arguments compactly.
    msg = {"role": "assistant", "content": content or "", "reasoning_content": reasoning or None}
    if calls:
        msg["tool_calls"] = [
            {
                "id": i,
                "type": "function",
                "function": {"name": n, "arguments": json.dumps(json.loads(a), separators=(",", ":"))},
            }
            for i, n, a in calls
        ]
    view = canonical(content, reasoning, [(n, a) for _, n, a in calls])
    return msg, view, usage


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat_round_trip(proxy: ProxyServer, stream: bool) -> None:
    sid = f"oa-{stream}"
    proxy.open_session(sid)
    client = openai.AsyncOpenAI(base_url=proxy.base_url + "/v1", api_key=sid, max_retries=0)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What is in this repository?"},
    ]
    views = []
    for _ in range(3):
        msg, view, usage = await _openai_turn(client, msgs, stream)
        views.append((view, usage))
        msgs.append(msg)
        for c in msg.get("tool_calls", []):
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": f"ran {c['function']['arguments']}"})
    _finish(proxy, sid, views)


# -- Anthropic Messages -------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_round_trip(proxy: ProxyServer, stream: bool) -> None:
    sid = f"an-{stream}"
    proxy.open_session(sid)
    client = anthropic.AsyncAnthropic(base_url=proxy.base_url, api_key=sid, max_retries=0)
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "What is in this repository?"}]}
    ]
    system = [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
    ]
    views = []
    for _ in range(3):
        kw = dict(
            model="my-claude-policy",
            max_tokens=1000,
            system=system,
            messages=msgs,
            tools=ANTHROPIC_TOOLS,
            metadata={"user_id": "u"},
            extra_query={"beta": "true"},
        )
        if stream:
            text_deltas = 0
            async with client.messages.stream(**kw) as s:
                async for ev in s:
                    if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                        text_deltas += 1
                m = await s.get_final_message()
            if not any(b.type == "tool_use" for b in m.content):  # one event per text token
                n_tokens = len(tokenizer().encode(m.content[-1].text, add_special_tokens=False))
                assert text_deltas >= n_tokens - 1
        else:
            m = await client.messages.create(**kw)
        assert m.model == "my-claude-policy"
        calls = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == ("tool_use" if calls else "end_turn")
        thinking = [b for b in m.content if b.type == "thinking"]
        assert all(b.signature for b in thinking)
        text = "".join(b.text for b in m.content if b.type == "text")
        views.append(
            (
                canonical(text, "".join(b.thinking for b in thinking) or None, [(b.name, b.input) for b in calls]),
                (m.usage.input_tokens, m.usage.output_tokens),
            )
        )
        # Claude Code replays every block in order, thinking with its signature.
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        if calls:
            msgs.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": b.id, "content": f"ran {b.input['command']}"}
                        for b in calls
                    ],
                }
            )
    _finish(proxy, sid, views)


# -- OpenAI Responses ---------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_responses_round_trip(proxy: ProxyServer, stream: bool) -> None:
    sid = f"rs-{stream}"
    proxy.open_session(sid)
    client = openai.AsyncOpenAI(base_url=f"{proxy.base_url}/s/{sid}/v1", api_key="unused", max_retries=0)
    items: list[dict[str, Any]] = [{"role": "user", "content": "What is in this repository?"}]
    views = []
    for _ in range(3):
        kw = dict(
            model="policy", instructions="You are a coding agent.", input=items, tools=RESPONSES_TOOLS, store=False
        )
        if stream:
            deltas: dict[str, str] = {}
            final = None
            async for ev in await client.responses.create(stream=True, **kw):
                if ev.type in (
                    "response.output_text.delta",
                    "response.function_call_arguments.delta",
                    "response.reasoning_text.delta",
                ):
                    deltas[ev.item_id] = deltas.get(ev.item_id, "") + ev.delta
                if ev.type == "response.completed":
                    final = ev.response
            assert final is not None
            for item in final.output:  # the deltas add up to the final items
                whole = {
                    "message": lambda i: i.content[0].text,
                    "function_call": lambda i: i.arguments,
                    "reasoning": lambda i: i.content[0].text,
                }[item.type](item)
                assert deltas.get(item.id, "") == whole
            r = final
        else:
            r = await client.responses.create(**kw)
        assert r.status == "completed"
        calls = [o for o in r.output if o.type == "function_call"]
        reasoning = "".join(c.text for o in r.output if o.type == "reasoning" for c in o.content or [])
        views.append(
            (
                canonical(r.output_text, reasoning or None, [(c.name, c.arguments) for c in calls]),
                (r.usage.input_tokens, r.usage.output_tokens),
            )
        )
        items += [o.model_dump(exclude_none=True) for o in r.output]
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": f"ran {c.arguments}"} for c in calls]
    _finish(proxy, sid, views)


async def test_models_and_count_tokens(proxy: ProxyServer) -> None:
    proxy.open_session("ct")
    client = anthropic.AsyncAnthropic(base_url=proxy.base_url, api_key="ct", max_retries=0)
    msgs = [{"role": "user", "content": "count me"}]
    counted = await client.messages.count_tokens(model="m", messages=msgs, tools=ANTHROPIC_TOOLS, system="sys")
    m = await client.messages.create(model="m", max_tokens=50, messages=msgs, tools=ANTHROPIC_TOOLS, system="sys")
    assert counted.input_tokens == m.usage.input_tokens > 10
    models = await openai.AsyncOpenAI(base_url=proxy.base_url + "/v1", api_key="ct").models.list()
    assert [x.id for x in models.data] == ["legorl-policy"]


async def test_trailing_assistant_message_is_continued(proxy: ProxyServer) -> None:
    """OpenCode's step limit appends an assistant message; the policy continues it."""
    proxy.open_session("prefill")
    client = openai.AsyncOpenAI(base_url=proxy.base_url + "/v1", api_key="prefill", max_retries=0)
    prefill = "CRITICAL - MAXIMUM STEPS REACHED. Respond with text only."
    r = await client.chat.completions.create(
        model="p",
        tools=OPENAI_TOOLS,
        messages=[{"role": "user", "content": "go"}, {"role": "assistant", "content": prefill}],
    )
    assert r.choices[0].message.tool_calls  # the script's first entry, generated after the prefill
    (turn,) = proxy.close_session("prefill")
    text = tokenizer().decode(turn.prompt_ids)
    assert text.endswith("<|im_start|>assistant\n" + prefill)
