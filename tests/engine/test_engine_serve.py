"""`legorl.engine.serve`: the in-process HF engine behind the vLLM completions protocol.

The real `vllm` engine client (and the official `openai` client) talk to a real uvicorn
server on loopback; what they get must be what the HF engine gives when called directly:
the same token ids and logprobs (greedy, and seeded sampling), the same finish reasons,
and vLLM's routing layout for MoE models (one row fewer than the engine records).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import torch

from legorl.engine.base import ContextLengthExceeded, EngineError
from legorl.engine.hf import HFEngine
from legorl.engine.serve import EngineServer
from legorl.engine.vllm import VLLMEngine
from legorl.models import load_tokenizer, resolve_model
from legorl.types import FinishReason, Generation, SamplingParams

TOK = load_tokenizer("tiny-qwen3")
NAME = "tiny-qwen3"


def chat(text: str) -> list[int]:
    return TOK.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)["input_ids"]


PROMPT = chat("fix the failing test in utils.py please")


@pytest.fixture(scope="module")
def dense() -> Iterator[HFEngine]:
    engine = HFEngine("tiny-qwen3", seed=0, prefix_cache_tokens=0)  # exact floats: the same computation each time
    yield engine
    asyncio.run(engine.close())


@pytest.fixture
async def server(dense: HFEngine) -> AsyncIterator[EngineServer]:
    async with EngineServer(dense, TOK, NAME, model_dir=resolve_model("tiny-qwen3")) as srv:
        yield srv


async def via_client(srv: EngineServer, params: SamplingParams, *, stream: bool, **kw: object) -> Generation:
    client = VLLMEngine(srv.url, NAME, stream=stream, **kw)  # type: ignore[arg-type]
    try:
        return await client.generate(PROMPT, params)
    finally:
        await client.close()


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=24),
        SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=24, seed=7),
    ],
    ids=["greedy", "seeded"],
)
async def test_client_through_server_equals_direct_engine(
    dense: HFEngine, server: EngineServer, params: SamplingParams, stream: bool
) -> None:
    direct = await dense.generate(PROMPT, params)
    served = await via_client(server, params, stream=stream)
    assert served.completion_ids == direct.completion_ids
    assert served.logprobs == direct.logprobs  # floats survive JSON exactly
    assert served.finish_reason == direct.finish_reason
    assert served.prompt_tokens == len(PROMPT)
    assert len(direct.completion_ids) >= 1


async def test_moe_routing_has_vllms_layout() -> None:
    moe = HFEngine("tiny-qwen3-moe", seed=0)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=6)
        direct = await moe.generate(PROMPT, params)
        async with EngineServer(moe, TOK, NAME) as srv:
            served = await via_client(srv, params, stream=False, return_routed_experts=True)
    finally:
        await moe.close()
    assert direct.routed_experts is not None and served.routed_experts is not None
    n = len(PROMPT) + len(direct.completion_ids)
    assert len(direct.routed_experts) == n
    assert (
        served.routed_experts.tolist() == direct.routed_experts[: n - 1].tolist()
    )  # vLLM never routes the last sampled token
    assert served.completion_ids == direct.completion_ids


async def test_sse_stream_is_shaped_like_vllms(server: EngineServer) -> None:
    body = {
        "model": NAME,
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0.0,
        "logprobs": 0,
        "stream": True,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(base_url=server.url) as http:
        resp = await http.post("/v1/completions", json=body)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in resp.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage, tokens = chunks[-1], chunks[:-1]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == len(PROMPT)
    assert "prompt_token_ids" in tokens[0]["choices"][0] and "prompt_token_ids" not in tokens[-1]["choices"][0]
    ids = [i for c in tokens for i in c["choices"][0]["token_ids"]]
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in tokens)  # one token per chunk
    assert [c["choices"][0]["finish_reason"] for c in tokens[:-1]] == [None] * (len(tokens) - 1)
    assert tokens[-1]["choices"][0]["finish_reason"] in ("stop", "length")  # on the last token, as vLLM does
    assert usage["usage"]["completion_tokens"] == len(ids)
    lp = [c["choices"][0]["logprobs"] for c in tokens]
    assert [t for x in lp for t in x["tokens"]] == [f"token_id:{i}" for i in ids]
    offsets = [o for x in lp for o in x["text_offset"]]
    assert offsets == [sum(len(f"token_id:{i}") for i in ids[:k]) for k in range(len(ids))]
    assert "".join(c["choices"][0]["text"] for c in tokens) == TOK.decode(ids, skip_special_tokens=True)


async def test_stop_string_is_cut_from_text_and_named(dense: HFEngine, server: EngineServer) -> None:
    free = await dense.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=24))
    text = TOK.decode(free.completion_ids, skip_special_tokens=True)
    stop = text.strip()[2:4] if len(text.strip()) >= 4 else text.strip()[:1]
    assert stop, "the greedy completion has no text to stop on"
    body = {
        "model": NAME,
        "prompt": PROMPT,
        "max_tokens": 24,
        "temperature": 0.0,
        "stop": [stop],
        "logprobs": 0,
        "return_token_ids": True,
    }
    async with httpx.AsyncClient(base_url=server.url) as http:
        choice = (await http.post("/v1/completions", json=body)).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert stop not in choice["text"] and text.startswith(choice["text"])
    assert choice["logprobs"]["tokens"][0] == TOK.decode([choice["token_ids"][0]])
    direct = await dense.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=24, stop=(stop,)))
    assert choice["token_ids"] == direct.completion_ids


async def test_openai_client_and_model_listing(server: EngineServer) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused")
    try:
        out = await client.completions.create(
            model=NAME, prompt=PROMPT, max_tokens=5, temperature=0.0, logprobs=0, extra_body={"return_token_ids": True}
        )
        models = await client.models.list()
    finally:
        await client.close()
    assert out.choices[0].finish_reason in ("stop", "length")
    assert len(out.choices[0].logprobs.token_logprobs) == out.usage.completion_tokens
    assert [m.id for m in models.data] == [NAME]
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/health")).status_code == 200


async def test_bad_requests_are_clear_4xx(server: EngineServer) -> None:
    cases = [
        ({"model": "gpt-4", "prompt": PROMPT}, 404, "does not exist"),
        ({"model": NAME, "prompt": "hello"}, 400, "token ids"),
        ({"model": NAME, "prompt": PROMPT, "logprobs": 5}, 400, "logprobs"),
        ({"model": NAME, "prompt": [PROMPT, PROMPT]}, 400, "one prompt"),
        ({"model": NAME, "prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
        ({"model": NAME, "prompt": PROMPT, "temperature": -1}, 400, "temperature"),
        ({"model": NAME, "prompt": [10**9]}, 400, "vocabulary"),
    ]
    async with httpx.AsyncClient(base_url=server.url) as http:
        for body, status, words in cases:
            resp = await http.post("/v1/completions", json=body)
            assert resp.status_code == status, (body, resp.text)
            assert words in resp.json()["error"]["message"], resp.text
        bad = await http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
    client = VLLMEngine(server.url, NAME, max_context=10**6)
    try:
        with pytest.raises(ContextLengthExceeded, match="maximum context length"):
            await client.generate([1] * 32768, SamplingParams(max_tokens=4))
        with pytest.raises(EngineError, match="HTTP 400.*vocabulary"):
            await client.generate([10**9], SamplingParams(max_tokens=2))
    finally:
        await client.close()


async def test_weight_reload_through_the_vllm_client(dense: HFEngine, server: EngineServer) -> None:
    model_dir = resolve_model("tiny-qwen3")
    name = "model.norm.weight"
    original = dense.model.state_dict()[name].clone()
    dense.load_state_dict({name: torch.zeros_like(original)}, version=1)
    client = VLLMEngine(server.url, NAME, served_model_dir=str(model_dir))
    try:
        await client.update_weights_from_disk(model_dir, version=5)
    finally:
        await client.close()
    assert torch.equal(dense.model.state_dict()[name], original)  # re-read from the served directory
    assert dense.policy_version == 5 and client.policy_version == 5
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/get_weight_version")).json() == {"weight_version": "5"}
        bad = await http.post("/collective_rpc", json={"method": "sleep"})
        assert bad.status_code == 400 and "reload_weights" in bad.json()["error"]["message"]
    dense.policy_version = 0


async def test_api_key_is_required_when_set(dense: HFEngine) -> None:
    async with EngineServer(dense, TOK, NAME, api_key="s3cret") as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            assert (await http.post("/v1/completions", json={"prompt": PROMPT})).status_code == 401
            assert (await http.get("/health")).status_code == 200
        client = VLLMEngine(srv.url, NAME, api_key="s3cret")
        try:
            gen = await client.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=3))
        finally:
            await client.close()
    assert gen.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
