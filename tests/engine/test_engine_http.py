"""The `vllm` and `sglang` engine clients against a real uvicorn server replaying documented bodies.

The server (127.0.0.1, a free port) answers from `tests/fixtures/engines/` (see its
README for the formats and the source files they follow); each test picks a `mode`
to make it misbehave the ways real servers do: 5xx, malformed bodies, stalls,
errors mid-stream, streams without a finish reason, context-length refusals.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from legorl.engine.base import ContextLengthExceeded, Engine, EngineError
from legorl.engine.sglang import SGLangEngine
from legorl.engine.vllm import VLLMEngine
from legorl.types import FinishReason, SamplingParams
from tests.helpers.paths import FIXTURES

FIX = FIXTURES / "engines"


def fixture(name: str) -> Any:
    return json.loads((FIX / name).read_text())


IDS = fixture("request_ids.json")
PROMPT, COMPLETION, LOGPROBS, ROUTING = IDS["prompt_ids"], IDS["completion_ids"], IDS["logprobs"], IDS["routing"]


class FakeServer:
    """vLLM- and SGLang-shaped endpoints on a real uvicorn server in a background thread."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.inflight = self.peak = 0
        app = FastAPI()
        app.post("/v1/completions")(self.completions)
        app.post("/generate")(self.generate)
        for path in ("/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/update_weights_from_disk"):
            app.post(path)(self.control)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        assert self.server.started, "fake engine server did not start"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    async def _record(self, request: Request) -> dict[str, Any]:
        body = await request.json() if (await request.body()) else {}
        self.requests.append((request.url.path, body, dict(request.query_params)))
        return body

    async def _errors(self) -> Response | None:
        if self.mode == "error500":
            return JSONResponse(fixture("vllm_error_internal.json"), status_code=500)
        if self.mode == "context":
            return JSONResponse(fixture("vllm_error_context_length.json"), status_code=400)
        if self.mode == "malformed":
            return Response(b'{"choices": [ {"index": 0, "text', media_type="application/json")
        if self.mode == "slow":
            await asyncio.sleep(3)
        return None

    def _sse(self, chunks: list[Any]) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for i, c in enumerate(chunks):
                if self.mode == "stall" and i == 1:
                    await asyncio.sleep(3)
                if self.mode == "midstream_error" and i == 1:
                    yield b'data: {"error": {"message": "CUDA error: an illegal memory access was encountered"}}\n\n'
                    break
                if self.mode == "malformed_stream" and i == 1:
                    yield b"data: {not json\n\n"
                    break
                yield b"data: " + json.dumps(c).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(self, request: Request) -> Response:
        body = await self._record(request)
        if (err := await self._errors()) is not None:
            return err
        if body.get("stream"):
            chunks = fixture("vllm_completion_stream.json")
            if self.mode == "no_finish":
                chunks = [c for c in chunks if not any(ch.get("finish_reason") for ch in c["choices"])]
            if self.mode == "old_vllm":
                for c in chunks:
                    for ch in c["choices"]:
                        ch.pop("token_ids", None)
            return self._sse(chunks)
        answer = fixture("vllm_completion.json")
        if self.mode == "old_vllm":
            answer["choices"][0].pop("token_ids")
        return JSONResponse(answer)

    async def generate(self, request: Request) -> Response:
        body = await self._record(request)
        if self.mode == "busy":  # hold each request a while to see how many overlap
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            await asyncio.sleep(0.2)
            self.inflight -= 1
        if (err := await self._errors()) is not None:
            if self.mode == "context":
                return JSONResponse(fixture("sglang_error_context_length.json"), status_code=400)
            return err
        if body.get("stream"):
            name = (
                "sglang_generate_stream_incremental.json"
                if self.mode == "incremental"
                else "sglang_generate_stream.json"
            )
            chunks = fixture(name)
            if self.mode == "no_finish":
                chunks = chunks[:-1]
            return self._sse(chunks)
        return JSONResponse(fixture("sglang_generate.json"))

    async def control(self, request: Request) -> Response:
        await self._record(request)
        if self.mode == "update_fails":
            return JSONResponse(
                {
                    "success": False,
                    "message": "Failed to get weights iterator: no safetensors found",
                    "num_paused_requests": 0,
                },
                status_code=400,
            )
        if request.url.path == "/update_weights_from_disk":
            return JSONResponse(fixture("sglang_update_weights_from_disk.json"))
        if request.url.path == "/collective_rpc":
            return JSONResponse({"results": [None]})
        return JSONResponse({"success": True})


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.stop()


@pytest.fixture
def fake(server: FakeServer) -> FakeServer:
    server.mode, server.requests = "ok", []
    return server


PARAMS = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=64, stop=("</tool_call>",), seed=7)


def vllm(fake: FakeServer, **kw: Any) -> VLLMEngine:
    return VLLMEngine(fake.url, "tiny-qwen3", request_timeout_s=kw.pop("timeout", 5.0), **kw)


def sglang(fake: FakeServer, **kw: Any) -> SGLangEngine:
    return SGLangEngine(fake.url, request_timeout_s=kw.pop("timeout", 5.0), **kw)


# ---- vLLM ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ok", "old_vllm"])
async def test_vllm_streaming_returns_ids_and_logprobs(fake: FakeServer, mode: str) -> None:
    fake.mode = mode
    engine = vllm(fake)
    assert isinstance(engine, Engine)
    steps = [s async for s in engine.stream(PROMPT, PARAMS)]
    await engine.close()
    assert [s.token_id for s in steps[:-1]] == COMPLETION
    assert [s.logprob for s in steps[:-1]] == LOGPROBS
    assert steps[-1].finish_reason == FinishReason.STOP and steps[-1].routed_experts is None
    path, body, _ = fake.requests[0]
    assert path == "/v1/completions"
    assert body["prompt"] == PROMPT and body["model"] == "tiny-qwen3"
    assert body["logprobs"] == 0 and body["return_tokens_as_token_ids"] is True and body["return_token_ids"] is True
    assert body["stream"] is True and body["stop"] == ["</tool_call>"] and body["seed"] == 7
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.8, 0.95, 64) and "top_k" not in body


async def test_vllm_routed_experts_come_from_the_non_streaming_answer(fake: FakeServer) -> None:
    engine = vllm(fake, return_routed_experts=True)
    g = await engine.generate(PROMPT, PARAMS)
    await engine.close()
    assert fake.requests[0][1]["stream"] is False
    assert g.completion_ids == COMPLETION and g.logprobs == LOGPROBS and g.prompt_tokens == len(PROMPT)
    assert g.routed_experts.tolist() == ROUTING  # (prompt + completion - 1, layers, top_k)
    assert len(g.routed_experts) == len(PROMPT) + len(COMPLETION) - 1


@pytest.mark.parametrize(
    ("mode", "exc", "match"),
    [
        ("error500", EngineError, "HTTP 500: EngineCore encountered an issue"),
        ("malformed", EngineError, "malformed JSON"),
        ("malformed_stream", EngineError, "malformed JSON"),
        ("midstream_error", EngineError, "illegal memory access"),
        ("no_finish", EngineError, "without a finish_reason"),
        ("slow", EngineError, "no answer within"),
        ("stall", EngineError, "stream stalled"),
        ("context", ContextLengthExceeded, "maximum context length"),
    ],
)
async def test_vllm_failures_become_clear_errors(fake: FakeServer, mode: str, exc: type, match: str) -> None:
    fake.mode = mode
    engine = vllm(fake, timeout=0.8, stream=mode != "malformed")
    with pytest.raises(exc, match=match):
        await engine.generate(PROMPT, PARAMS)
    await engine.close()


async def test_unreachable_server_is_an_engine_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = VLLMEngine(f"http://127.0.0.1:{port}", "m", request_timeout_s=2)
    with pytest.raises(EngineError, match="cannot reach the server"):
        await engine.generate(PROMPT, PARAMS)
    await engine.close()


async def test_vllm_update_weights_from_disk_reloads_the_served_directory(fake: FakeServer, tmp_path: Path) -> None:
    engine = vllm(fake, served_model_dir=str(tmp_path))
    await engine.update_weights_from_disk(tmp_path, version=3)
    assert engine.policy_version == 3
    calls = [(p, b, q) for p, b, q in fake.requests]
    assert calls == [
        ("/collective_rpc", {"method": "reload_weights"}, {}),
        ("/reset_prefix_cache", {}, {"reset_running_requests": "true"}),
        ("/update_weight_version", {"new_version": "3"}, {}),
    ]
    with pytest.raises(ValueError, match="only from the directory it was launched on"):
        await engine.update_weights_from_disk(tmp_path / "elsewhere", version=4)
    fake.mode = "update_fails"
    with pytest.raises(EngineError, match="no safetensors found"):
        await engine.update_weights_from_disk(tmp_path, version=4)
    assert engine.policy_version == 3
    await engine.close()


# ---- SGLang ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ok", "incremental"])
async def test_sglang_streaming_handles_cumulative_and_incremental_chunks(fake: FakeServer, mode: str) -> None:
    fake.mode = mode
    engine = sglang(fake)
    g = await engine.generate(PROMPT, PARAMS)
    await engine.close()
    assert g.completion_ids == COMPLETION and g.logprobs == LOGPROBS
    assert g.finish_reason == FinishReason.STOP and g.routed_experts is None
    path, body, _ = fake.requests[0]
    assert path == "/generate" and body["input_ids"] == PROMPT and body["stream"] is True
    assert body["return_logprob"] is True and body["return_routed_experts"] is False
    sp = body["sampling_params"]
    assert (sp["max_new_tokens"], sp["temperature"], sp["top_p"], sp["top_k"]) == (64, 0.8, 0.95, -1)
    assert sp["stop"] == ["</tool_call>"] and sp["sampling_seed"] == 7 and sp["skip_special_tokens"] is False


async def test_sglang_routed_experts_are_decoded_to_tokens_layers_topk(fake: FakeServer) -> None:
    engine = sglang(fake, stream=False, return_routed_experts=True, moe_top_k=2)
    g = await engine.generate(PROMPT, PARAMS)
    await engine.close()
    assert fake.requests[0][1]["return_routed_experts"] is True
    assert g.completion_ids == COMPLETION and g.routed_experts.tolist() == ROUTING


async def test_sglang_routing_needs_top_k() -> None:
    with pytest.raises(ValueError, match="moe_top_k"):
        SGLangEngine("http://127.0.0.1:1", return_routed_experts=True)


@pytest.mark.parametrize(
    ("mode", "exc", "match"),
    [
        ("error500", EngineError, "HTTP 500"),
        ("midstream_error", EngineError, "illegal memory access"),
        ("no_finish", EngineError, "without a finish_reason"),
        ("stall", EngineError, "stream stalled"),
        ("context", ContextLengthExceeded, "longer than the model's context length"),
    ],
)
async def test_sglang_failures_become_clear_errors(fake: FakeServer, mode: str, exc: type, match: str) -> None:
    fake.mode = mode
    engine = sglang(fake, timeout=0.8)
    with pytest.raises(exc, match=match):
        await engine.generate(PROMPT, PARAMS)
    await engine.close()


async def test_sglang_update_weights_from_disk(fake: FakeServer, tmp_path: Path) -> None:
    engine = sglang(fake)
    await engine.update_weights_from_disk(tmp_path, version=3)
    assert engine.policy_version == 3
    assert fake.requests[-1][:2] == ("/update_weights_from_disk", {"model_path": str(tmp_path), "weight_version": "3"})
    fake.mode = "update_fails"
    with pytest.raises(EngineError, match="no safetensors found"):
        await engine.update_weights_from_disk(tmp_path, version=4)
    assert engine.policy_version == 3
    await engine.close()


async def test_requests_in_flight_are_bounded_by_max_concurrency(fake: FakeServer) -> None:
    fake.mode, fake.peak = "busy", 0
    engine = sglang(fake, max_concurrency=2)
    results = await asyncio.gather(*[engine.generate(PROMPT, PARAMS) for _ in range(6)])
    await engine.close()
    assert all(r.completion_ids == COMPLETION for r in results)
    assert len(fake.requests) == 6 and fake.peak == 2
