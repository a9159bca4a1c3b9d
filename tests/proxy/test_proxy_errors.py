"""Bad input, refused features, overflow and engine faults: each a JSON error in the
dialect's shape that names the problem, and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from legorl.engine.base import EngineError, collect
from legorl.engine.scripted import ScriptedEngine
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.types import FinishReason, SamplingParams, TokenStep
from tests.helpers.proxy_util import ProxyScript, SpyEngine, tokenizer

CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"
RESP = "/v1/responses"
GOOD = {
    CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    MSGS: {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]},
    RESP: {"model": "m", "input": "hi"},
}


class FaultyEngine:
    """Fails at once, after a few tokens, or hangs — to exercise the proxy's error paths."""

    name = "faulty"
    policy_version = 0
    max_context = 32768

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        if self.mode == "fail":
            raise EngineError("GPU fell off the bus")
        for t in tokenizer().encode("partial answer here", add_special_tokens=False):
            yield TokenStep(t, -0.5)
        if self.mode == "fail_mid":
            raise EngineError("lost the KV cache")
        await asyncio.sleep(3600)  # hang
        yield TokenStep(None, None, FinishReason.STOP)

    async def generate(self, prompt_ids: list[int], params: SamplingParams):
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def close(self) -> None:
        return None


@pytest.fixture
def proxy_script() -> ProxyScript:
    return ProxyScript(
        ["fine, thanks"], mode="cycle", config={"max_context": 400, "max_body_bytes": 1 << 20}, standalone=True
    )


def anthropic_error(r: httpx.Response) -> dict[str, Any]:
    j = r.json()
    assert j["type"] == "error" and set(j["error"]) == {"type", "message"}, j
    return j["error"]


def openai_error(r: httpx.Response) -> dict[str, Any]:
    j = r.json()
    assert set(j) == {"error"} and {"message", "type"} <= set(j["error"]), j
    return j["error"]


def err_of(path: str, r: httpx.Response) -> dict[str, Any]:
    return anthropic_error(r) if path == MSGS else openai_error(r)


BAD = [
    (CHAT, b"{not json", "not valid JSON"),
    (CHAT, b"[1, 2]", "must be a JSON object"),
    (CHAT, b"", "body is empty"),
    (CHAT, {"model": "m", "messages": "hi"}, "messages: expected an array"),
    (CHAT, {"model": "m", "messages": []}, "at least one message"),
    (
        CHAT,
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "10"},
        "max_tokens: expected an integer",
    ),
    (
        CHAT,
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        "max_tokens: must be at least 1",
    ),
    (CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n=2"),
    (
        CHAT,
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "modalities": ["text", "audio"]},
        "audio output",
    ),
    (
        CHAT,
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
        "audio input",
    ),
    (CHAT, {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    (
        CHAT,
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
        "stream: expected a boolean",
    ),
    (
        CHAT,
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search"}]},
        "tools[0].type",
    ),
    (MSGS, {"model": "m", "max_tokens": 5, "messages": {"role": "user"}}, "messages: expected an array"),
    (
        MSGS,
        {"model": "m", "max_tokens": "lots", "messages": [{"role": "user", "content": "x"}]},
        "max_tokens: expected an integer",
    ),
    (
        MSGS,
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "video"}]}]},
        "unsupported block type 'video'",
    ),
    (
        MSGS,
        {
            "model": "m",
            "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "x", "input": "ls"}]}],
        },
        "input: expected an object",
    ),
    (MSGS, b"\xff\xfe", "not valid JSON"),
    (RESP, {"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    (RESP, {"model": "m", "input": [{"type": "computer_call"}]}, "input item type 'computer_call'"),
    (RESP, {"model": "m"}, "input: required"),
]


async def test_bad_requests_between_good_ones(proxy: ProxyServer) -> None:
    async with httpx.AsyncClient(base_url=proxy.base_url, headers={"x-api-key": "s1"}) as c:
        for path, body, words in BAD:
            good = await c.post(path, json=GOOD[path])
            assert good.status_code == 200, good.text
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = await c.post(path, content=content, headers={"content-type": "application/json"})
            assert r.status_code == 400, (path, body, r.text)
            assert words in err_of(path, r)["message"], (words, r.text)
        # a burst, concurrently, then the server still answers
        rs = await asyncio.gather(
            *[c.post(p, content=b if isinstance(b, bytes) else json.dumps(b).encode()) for p, b, _ in BAD * 3]
        )
        assert {r.status_code for r in rs} == {400}
        assert (await c.post(CHAT, json=GOOD[CHAT])).status_code == 200
    assert len(proxy.sessions.open_sessions["s1"].turns) == len(BAD) + 1


async def test_unknown_fields_are_ignored(proxy: ProxyServer) -> None:
    body = {
        "model": "m",
        "max_tokens": 30,
        "metadata": {"user_id": '{"session_id": "x"}'},
        "thinking": {"type": "adaptive", "display": "updates"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "tools": [
            {
                "name": "Bash",
                "input_schema": {"type": "object"},
                "defer_loading": True,
                "cache_control": {"type": "ephemeral"},
            }
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "mid-conversation system turn"},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                            {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                        ],
                    }
                ],
            },
        ],
        "some_future_field": {"a": 1},
    }
    async with httpx.AsyncClient(base_url=proxy.base_url) as c:
        r = await c.post(MSGS + "?beta=true", json=body, headers={"x-api-key": "s2", "anthropic-beta": "a,b"})
        assert r.status_code == 200, r.text
        r = await c.post(
            CHAT,
            headers={"authorization": "Bearer s2"},
            json={
                **GOOD[CHAT],
                "reasoning_effort": "high",
                "prompt_cache_key": "conv-1",
                "stream_options": None,
                "messages": [
                    {"role": "system", "content": [{"type": "text", "text": "sys"}]},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}],
                    },
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "name": "bash", "content": [{"type": "text", "text": "ok"}]},
                ],
            },
        )
        assert r.status_code == 200, r.text
    turns = proxy.sessions.open_sessions["s2"].turns
    text = tokenizer().decode(turns[0].prompt_ids)
    assert "[image]" in text and "mid-conversation system turn" in text and "AAAA" not in text


async def test_body_size_limit(proxy: ProxyServer) -> None:
    big = json.dumps({**GOOD[CHAT], "messages": [{"role": "user", "content": "x" * (10 * 1024 * 1024)}]}).encode()
    async with httpx.AsyncClient(base_url=proxy.base_url, headers={"x-api-key": "s3"}, timeout=60) as c:
        r = await c.post(CHAT, content=big)  # Content-Length known: refused before reading
        assert r.status_code == 413 and "exceeds the limit" in openai_error(r)["message"]

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused while reading
            for i in range(0, len(big), 1 << 16):
                yield big[i : i + (1 << 16)]

        r = await c.post(MSGS, content=chunks())
        assert r.status_code == 413 and anthropic_error(r)["type"] == "request_too_large"
        assert (await c.post(CHAT, json=GOOD[CHAT])).status_code == 200


async def test_context_overflow_is_the_error_each_harness_compacts_on(proxy: ProxyServer) -> None:
    long = "word " * 2000
    a = anthropic.AsyncAnthropic(base_url=proxy.base_url, api_key="s4", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        await a.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": long}])
    msg = e.value.body["error"]["message"]
    n = int(msg.split(": ")[1].split(" tokens")[0])
    assert msg == f"prompt is too long: {n} tokens > 400 maximum" and n > 400
    count = await a.messages.count_tokens(model="m", messages=[{"role": "user", "content": long}])
    assert count.input_tokens == n
    o = openai.AsyncOpenAI(base_url=proxy.base_url + "/v1", api_key="s4", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e2:
        await o.chat.completions.create(model="m", messages=[{"role": "user", "content": long}])
    assert "maximum context length is 400 tokens" in e2.value.message
    assert e2.value.code == "context_length_exceeded"


async def test_unknown_session_in_managed_mode() -> None:
    engine = ScriptedEngine(["x"], tokenizer())
    async with ProxyServer(ProxyConfig(port=0), engine, ChatMLRenderer(tokenizer())) as srv:
        srv.open_session("known")
        async with httpx.AsyncClient(base_url=srv.base_url) as c:
            r = await c.post(MSGS, json=GOOD[MSGS], headers={"x-api-key": "stranger"})
            assert r.status_code == 401 and "'stranger' is not open" in anthropic_error(r)["message"]
            r = await c.post("/s/stranger" + CHAT, json=GOOD[CHAT])
            assert r.status_code == 404 and openai_error(r)["type"] == "not_found_error"
            r = await c.post(CHAT, json=GOOD[CHAT])
            assert r.status_code == 401 and "no session" in openai_error(r)["message"]
            assert (await c.post("/s/known" + RESP, json=GOOD[RESP])).status_code == 200
            assert srv.close_session("known")[0].dialect == "responses"
            r = await c.post("/s/known" + CHAT, json=GOOD[CHAT])
            assert r.status_code == 404 and "is closed" in openai_error(r)["message"]
            assert (await c.get("/v1/nothing")).status_code == 404


@pytest.mark.parametrize("path", [CHAT, MSGS, RESP])
async def test_engine_failure_is_a_502_not_a_hang(path: str) -> None:
    async with ProxyServer(
        ProxyConfig(port=0), FaultyEngine("fail"), ChatMLRenderer(tokenizer()), standalone=True
    ) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, headers={"x-api-key": "k"}) as c:
            for stream in (False, True):
                r = await c.post(path, json={**GOOD[path], "stream": stream})
                assert r.status_code == 502 and "GPU fell off the bus" in err_of(path, r)["message"]
        assert srv.sessions.open_sessions["k"].engine_errors == 2  # rollouts turn this into infra_error


@pytest.mark.parametrize("path", [CHAT, MSGS, RESP])
async def test_engine_failure_mid_stream_ends_the_stream_with_an_error(path: str) -> None:
    engine = SpyEngine(FaultyEngine("fail_mid"))
    async with ProxyServer(ProxyConfig(port=0), engine, ChatMLRenderer(tokenizer()), standalone=True) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, headers={"x-api-key": "k"}) as c:
            r = await c.post(path, json={**GOOD[path], "stream": True})
            assert r.status_code == 200
            last = [ln for ln in r.text.splitlines() if ln.startswith("data:")][-1]
            assert "lost the KV cache" in last
        s = srv.sessions.open_sessions["k"]
        assert not s.turns and len(s.aborted) == 1 and s.aborted[0].finish_reason == "abort"


async def test_timeout_and_client_disconnect_abort_the_generation() -> None:
    engine = SpyEngine(FaultyEngine("hang"))
    cfg = ProxyConfig(port=0, request_timeout_s=0.5)
    async with ProxyServer(cfg, engine, ChatMLRenderer(tokenizer()), standalone=True) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, headers={"x-api-key": "k"}) as c:
            r = await c.post(MSGS, json=GOOD[MSGS])
            assert r.status_code == 504 and anthropic_error(r)["type"] == "timeout_error"
            async with c.stream("POST", CHAT, json={**GOOD[CHAT], "stream": True}) as r:
                assert "error" in (await r.aread()).decode()  # the timeout ends the stream with an error
        srv.cfg.request_timeout_s = 60
        async with httpx.AsyncClient(base_url=srv.base_url, headers={"x-api-key": "k"}) as c:
            async with c.stream("POST", CHAT, json={**GOOD[CHAT], "stream": True}) as r:
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data:")
                    if seen == 3:
                        break  # leave mid-stream; the proxy must notice and stop the engine
        for _ in range(100):
            if engine.closed_streams == 3:
                break
            await asyncio.sleep(0.05)
        assert engine.closed_streams == 3
        s = srv.sessions.open_sessions["k"]
        assert len(s.aborted) == 3 and not s.turns
        assert all(t.completion_ids for t in s.aborted[1:])


async def test_stop_strings_are_honoured_and_trimmed() -> None:
    engine = SpyEngine(ScriptedEngine(["call <function=bash>ls</function> then more text"], tokenizer()))
    async with ProxyServer(ProxyConfig(port=0), engine, ChatMLRenderer(tokenizer()), standalone=True) as srv:
        o = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key="k", max_retries=0)
        r = await o.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stop=["</function"])
        assert r.choices[0].message.content == "call <function=bash>ls"
        s = await o.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stop=["</function"], stream=True
        )
        assert "".join([ch.choices[0].delta.content or "" async for ch in s if ch.choices]) == "call <function=bash>ls"
        a = anthropic.AsyncAnthropic(base_url=srv.base_url, api_key="k", max_retries=0)
        m = await a.messages.create(
            model="m", max_tokens=50, messages=[{"role": "user", "content": "x"}], stop_sequences=["</function"]
        )
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == "</function"
        assert m.content[0].text == "call <function=bash>ls"
        turns = srv.sessions.open_sessions["k"].turns
        assert all(
            t.sampling_used["stop"] == ["</function"] or t.sampling_used["stop"] == ("</function",) for t in turns
        )
        assert all(t.response_text == "call <function=bash>ls" for t in turns)
        r = await o.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=3)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
        assert srv.sessions.open_sessions["k"].turns[-1].sampling_requested == {"max_tokens": 3}
