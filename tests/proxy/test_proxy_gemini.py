"""The Gemini API dialect through a real loopback server and Google's official client
(`google-genai`), as tests/proxy/test_proxy_dialects.py does for the other three dialects.

For every turn: the client's view (text, thought text, function calls) equals the decoding
of the recorded completion ids, recorded logprobs equal the engine's, `usageMetadata` is
the true token counts, and a session whose history the client replays (its `model`
contents as received, `functionResponse` parts for the calls) assembles into ONE segment.
The same holds for the real `hf` engine's random-weight completions. Bad input is a 4xx in
Google's error shape, never a 5xx (hypothesis over generate, stream and countTokens).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legorl.engine.scripted import ScriptedEngine
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.trajectory import assemble
from tests.helpers.dialect_script import EXPECTED_CALLS, OPENAI_TOOLS, SCRIPT
from tests.helpers.proxy_fuzz import (
    BODIES,
    GEM,
    GEM_COUNT,
    GEM_STREAM,
    STREAM_ENDS,
    ThreadedProxy,
    is_dialect_error,
    turns_recorded,
)
from tests.helpers.proxy_util import ProxyScript, canonical, check_turn, spied_proxy, tokenizer

SYSTEM = "You are a coding agent."
BASH = types.FunctionDeclaration(
    name="bash", description="Run a shell command.", parameters_json_schema=OPENAI_TOOLS[0]["function"]["parameters"]
)
# Gemini CLI declares its tools with Google's OpenAPI subset (upper-case type names).
BASH_OPENAPI = types.FunctionDeclaration(
    name="bash",
    description="Run a shell command.",
    parameters=types.Schema(
        type="OBJECT",
        properties={"command": types.Schema(type="STRING"), "timeout": types.Schema(type="NUMBER")},
        required=["command"],
    ),
)


def client(srv: ProxyServer, key: str, base: str | None = None) -> genai.Client:
    return genai.Client(
        api_key=key, http_options=types.HttpOptions(base_url=base or srv.base_url, api_version="v1beta")
    )


def config(decl: types.FunctionDeclaration = BASH, **kw: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        system_instruction=SYSTEM,
        tools=[types.Tool(function_declarations=[decl])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        **kw,
    )


@pytest.fixture
def proxy_script() -> ProxyScript:
    return ProxyScript(SCRIPT)


async def _turn(
    c: genai.Client,
    contents: list[types.Content],
    stream: bool,
    cfg: types.GenerateContentConfig,
    model: str = "legorl-policy",
) -> tuple[types.Content, tuple, tuple[int, int], str]:
    """One call; the `model` content as a client keeps it, the view, usage, finishReason."""
    if stream:
        parts: list[types.Part] = []
        finish, usage, chunks = None, None, 0
        async for ch in await c.aio.models.generate_content_stream(model=model, contents=contents, config=cfg):
            chunks += 1
            assert ch.model_version == model
            cand = ch.candidates[0]
            parts += cand.content.parts or []
            finish = cand.finish_reason or finish
            usage = ch.usage_metadata
        assert chunks > 1  # true streaming: one chunk per piece
    else:
        r = await c.aio.models.generate_content(model=model, contents=contents, config=cfg)
        assert r.model_version == model
        parts, finish, usage = r.candidates[0].content.parts, r.candidates[0].finish_reason, r.usage_metadata
    text = "".join(p.text for p in parts if p.text and not p.thought)
    thought = "".join(p.text for p in parts if p.text and p.thought)
    calls = [p.function_call for p in parts if p.function_call]
    assert all(fc.id for fc in calls)
    view = canonical(text, thought or None, [(fc.name, fc.args) for fc in calls])
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    return (
        types.Content(role="model", parts=parts),
        view,
        (usage.prompt_token_count, usage.candidates_token_count),
        finish.value if finish else "",
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_gemini_round_trip(proxy: ProxyServer, stream: bool) -> None:
    sid = f"gm-{stream}"
    proxy.open_session(sid)
    c = client(proxy, sid)
    contents = [types.Content(role="user", parts=[types.Part(text="What is in this repository?")])]
    views = []
    for _ in range(3):
        model_content, view, usage, finish = await _turn(c, contents, stream, config(BASH_OPENAPI if stream else BASH))
        assert finish == "STOP"
        views.append((view, usage))
        contents.append(model_content)  # replayed as received, thought parts included
        calls = [p.function_call for p in model_content.parts if p.function_call]
        if calls:
            contents.append(
                types.Content(
                    role="user",
                    parts=[
                        types.Part(
                            function_response=types.FunctionResponse(
                                id=fc.id, name=fc.name, response={"output": f"ran {fc.args['command']}"}
                            )
                        )
                        for fc in calls
                    ],
                )
            )
    turns = proxy.close_session(sid)
    assert len(turns) == 3
    for turn, (view, usage) in zip(turns, views, strict=True):
        check_turn(turn, proxy.spy, view, usage)
        assert not turn.format_error and turn.dialect == "gemini"
    assert [v[0][2] for v in views] == EXPECTED_CALLS
    prompt = tokenizer().decode(turns[1].prompt_ids)
    assert prompt.startswith("<|im_start|>system\n" + SYSTEM) and "ran ls" in prompt and "ran pwd" in prompt
    assert '"timeout": {"type": "number"}' in prompt  # Google's type names as JSON Schema
    traj = assemble(turns)
    assert len(traj.segments) == 1, f"history did not re-render to the sampled ids: {traj.stats}"


async def test_count_tokens_key_routes_and_generation_config(proxy: ProxyServer) -> None:
    proxy.open_session("gct")
    c = client(proxy, "gct")
    contents = [types.Content(role="user", parts=[types.Part(text="count me")])]
    counted = await c.aio.models.count_tokens(model="m", contents=contents)
    r = await c.aio.models.generate_content(
        model="m",
        contents=contents,
        config=types.GenerateContentConfig(temperature=0.3, top_p=0.9, max_output_tokens=7, stop_sequences=["STOP"]),
    )
    assert counted.total_tokens == r.usage_metadata.prompt_token_count > 3
    assert r.candidates[0].finish_reason.value == "MAX_TOKENS"  # 7 tokens of the script's long first answer
    # the session also travels as `?key=` and in the URL
    async with httpx.AsyncClient(base_url=proxy.base_url, timeout=30) as h:
        body = {"contents": [{"parts": [{"text": "again"}]}]}
        assert (await h.post("/v1beta/models/m:countTokens?key=gct", json=body)).json()["totalTokens"] > 3
        assert (await h.post("/s/gct/v1beta/models/m:generateContent", json=body)).status_code == 200
    turns = proxy.close_session("gct")
    assert len(turns) == 2
    assert turns[0].sampling_requested == {"temperature": 0.3, "top_p": 0.9, "max_tokens": 7}
    assert turns[0].sampling_used["max_tokens"] == 7 and "STOP" in turns[0].sampling_used["stop"]


async def test_errors_are_google_shaped_4xx(proxy: ProxyServer) -> None:
    proxy.open_session("gerr")
    c = client(proxy, "gerr")
    with pytest.raises(genai_errors.ClientError) as e:
        await c.aio.models.generate_content(
            model="m",
            contents="hi",
            config=types.GenerateContentConfig(tools=[types.Tool(google_search=types.GoogleSearch())]),
        )
    assert e.value.code == 400 and e.value.status == "INVALID_ARGUMENT" and "googleSearch" in e.value.message
    async with httpx.AsyncClient(base_url=proxy.base_url, headers={"x-goog-api-key": "gerr"}, timeout=30) as h:
        cases = [
            ("/v1beta/models/m:generateContent", {"contents": []}, 400, "contents"),
            (
                "/v1beta/models/m:generateContent",
                {"contents": [{"role": "robot", "parts": [{"text": "x"}]}]},
                400,
                "role",
            ),
            (
                "/v1beta/models/m:generateContent",
                {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}},
                400,
                "candidateCount",
            ),
            (
                "/v1beta/models/m:streamGenerateContent?alt=sse",
                {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": "9"}},
                400,
                "maxOutputTokens",
            ),
            ("/v1beta/models/m:embedContent", {"contents": []}, 404, "embedContent"),
            (
                "/v1beta/models/m:streamGenerateContent?alt=sse",
                {"contents": [{"parts": [{"text": "x"}]}], "labels": json.loads("[" * 300 + "]" * 300)},
                400,
                "max_json_depth",
            ),
            (
                "/v1beta/models/m:generateContent",
                {"contents": [{"parts": [{"text": "y" * 40_000}]}]},
                400,
                "maximum number of tokens",
            ),
        ]
        for path, body, status, needle in cases:
            r = await h.post(path, json=body)
            assert r.status_code == status and is_dialect_error(path, r.json()), (path, r.text)
            assert needle in r.json()["error"]["message"] and r.json()["error"]["code"] == status
        r = await h.get("/v1beta/models/m:generateContent")
        assert r.status_code == 405 and is_dialect_error("/v1beta/", r.json())
    assert proxy.close_session("gerr") == []


# -- the real hf engine ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf() -> Iterator[Any]:
    from legorl.engine.hf import HFEngine

    engine = HFEngine("tiny-qwen3", tokenizer(), seed=0, num_threads=1)
    yield engine
    asyncio.run(engine.close())


@pytest.fixture
async def hf_proxy(hf: Any):
    async with spied_proxy(hf, max_tokens=24, standalone=True) as srv:
        yield srv


@pytest.mark.parametrize("stream", [False, True])
async def test_gemini_with_hf(hf_proxy: ProxyServer, stream: bool) -> None:
    sid = f"hf-gm-{stream}"
    c = client(hf_proxy, sid)
    contents = [
        types.Content(role="user", parts=[types.Part(text="list files")]),
        types.Content(
            role="model",
            parts=[types.Part(function_call=types.FunctionCall(id="c0", name="bash", args={"command": "ls"}))],
        ),
        types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(id="c0", name="bash", response={"output": "a.py b.py"})
                )
            ],
        ),
    ]
    views = []
    for k in range(2):
        model_content, view, usage, _ = await _turn(c, contents, stream and k == 0, config(), model="m")
        views.append((view, usage))
        contents.append(model_content)
        replies = [
            types.Part(
                function_response=types.FunctionResponse(
                    id=p.function_call.id, name=p.function_call.name, response={"output": "ok"}
                )
            )
            for p in model_content.parts
            if p.function_call
        ]
        contents.append(types.Content(role="user", parts=[*replies, types.Part(text=f"continue {k}")]))
    turns = hf_proxy.close_session(sid)
    assert len(turns) == len(views)
    for turn, (view, usage) in zip(turns, views, strict=True):
        check_turn(turn, hf_proxy.spy, view, usage)
    assert len(assemble(turns).segments) == 1


# -- fuzz: never a 5xx, every accepted turn recorded --------------------------------------------
def test_gemini_fuzz_never_5xx_and_every_accepted_turn_recorded(tmp_path: Path) -> None:
    def make() -> ProxyServer:
        cfg = ProxyConfig(port=0, max_context=4000, header_timeout_s=1.0, body_timeout_s=1.0)
        return ProxyServer(
            cfg,
            ScriptedEngine(["fine, thanks"], tokenizer()),
            ChatMLRenderer(tokenizer()),
            standalone=True,
            out_dir=tmp_path,
        )

    counts = {"ok": 0, "4xx": 0}
    with ThreadedProxy(make) as tp, httpx.Client(base_url=tp.srv.base_url, timeout=30) as h:

        @settings(
            max_examples=150, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
        )
        @given(body=BODIES[GEM](), path=st.sampled_from([GEM, GEM_STREAM]))
        def one(body: Any, path: str) -> None:
            r = h.post(f"/s/fuzz-gem{path}", content=json.dumps(body), headers={"content-type": "application/json"})
            assert r.status_code < 500, (body, r.status_code, r.text)
            if r.status_code == 200:
                counts["ok"] += 1
                if path == GEM_STREAM:
                    assert r.headers["content-type"].startswith("text/event-stream")
                    assert any(end in r.content.rsplit(b"data: ", 1)[-1] for end in STREAM_ENDS[GEM]), r.content[-300:]
            else:
                counts["4xx"] += 1
                assert is_dialect_error(path, r.json()), r.text
            r = h.post(
                f"/s/fuzz-count{GEM_COUNT}", content=json.dumps(body), headers={"content-type": "application/json"}
            )
            assert r.status_code < 500 and (r.status_code == 200 or is_dialect_error(GEM_COUNT, r.json())), r.text

        before = turns_recorded(tmp_path)
        one()
        print(counts)
        assert counts["ok"] > 0 and counts["4xx"] > 0, counts
        assert turns_recorded(tmp_path) - before == counts["ok"]
