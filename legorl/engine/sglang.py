"""`sglang`: token-in/token-out client of an SGLang server's native `/generate` API.

Request (sgl-project/sglang `python/sglang/srt/managers/io_struct.py::GenerateReqInput`,
`python/sglang/srt/sampling/sampling_params.py::SamplingParams`): `input_ids`,
`sampling_params` {max_new_tokens, temperature, top_p, top_k (-1 = all), stop,
sampling_seed, skip_special_tokens: false, no_stop_trim: true}, `return_logprob: true`,
`return_routed_experts`, `stream`.

Response (`python/sglang/srt/managers/tokenizer_manager_components/output_processor.py`):
`{"text", "output_ids", "meta_info"}` with `meta_info.output_token_logprobs` a list of
`[logprob, token_id, text|null]`, `meta_info.finish_reason` null while running, then
`{"type": "stop"|"length"|"abort", ...}`, `meta_info.completion_tokens`, and with
routing `meta_info.routed_experts` = base64 of little-endian int32, logical shape
(prompt + completion - 1, layers * top_k) — the last sampled token is never forwarded.

Streaming (`python/sglang/srt/entrypoints/http_server.py::generate_request`): SSE
`data: {...}` per step then `data: [DONE]`; errors as `data: {"error": {"message"}}`.
By default each chunk repeats the *cumulative* `output_ids` / `output_token_logprobs`;
with the server flag `--incremental-streaming-output` they are deltas. Both are handled:
a chunk is cumulative when its length equals `meta_info.completion_tokens`.

Logprob meaning: SGLang reports `log_softmax(logits / T)` *before* top-k/top-p (greedy:
at T = 1), i.e. equal to `legorl.engine.sampling` when top_p = 1 and top_k = -1; with a
nucleus the trainer must recompute without the filters (or use `return_sampling_mask`
builds). Leave `SGLANG_RETURN_ORIGINAL_LOGPROB` unset on the server (it switches to T = 1).

Weight sync: `POST /update_weights_from_disk {"model_path", "weight_version"}` →
`{"success", "message", "num_paused_requests"}` (http_server.py::update_weights_from_disk).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from legorl.engine.base import EngineError, check_prompt, collect
from legorl.engine.http_client import HTTPEngineClient, check
from legorl.engine.sampling import validate_params
from legorl.types import FinishReason, Generation, Routing, SamplingParams, TokenStep, as_routing

FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def finish_reason(value: Any) -> FinishReason:
    kind = value.get("type") if isinstance(value, dict) else value
    if kind in FINISH:
        if kind == "abort" and isinstance(value, dict) and value.get("status_code", 200) >= 500:
            raise EngineError(f"sglang aborted the request: {value.get('message')}")
        return FINISH[kind]
    raise EngineError(f"sglang: generation ended with finish_reason {value!r}")


def decode_routing(data: str, tokens: int, top_k: int) -> Routing:
    """SGLang's routed experts → [token][layer][k] for `tokens` rows."""
    try:
        flat = np.frombuffer(base64.b64decode(data), dtype="<i4")
    except Exception as exc:
        raise EngineError(f"sglang: routed_experts is not base64 int32 data: {exc}") from exc
    if tokens <= 0 or flat.size % (tokens * top_k):
        raise EngineError(
            f"sglang: routed_experts has {flat.size} ids, not a multiple of {tokens} tokens x top_k {top_k}"
        )
    return as_routing(flat.reshape(tokens, -1, top_k))


class SGLangEngine:
    """Client of one SGLang server; generation by token ids."""

    name = "sglang"
    Options: ClassVar[type | None] = None  # no `[engine] options`: every setting is an `[engine]` field

    def __init__(
        self,
        url: str,
        *,
        request_timeout_s: float = 600.0,
        max_concurrency: int = 256,
        api_key: str | None = None,
        stream: bool = True,
        return_routed_experts: bool = False,
        moe_top_k: int | None = None,
        max_context: int = 32768,
    ) -> None:
        if return_routed_experts and not moe_top_k:
            raise ValueError("sglang return_routed_experts needs moe_top_k (experts per token) to shape the routing")
        self.http = HTTPEngineClient("sglang", url, request_timeout_s, max_concurrency, api_key)
        self.use_stream = stream
        self.return_routed_experts = return_routed_experts
        self.moe_top_k = moe_top_k or 0
        self.max_context = max_context
        self.policy_version = 0

    @classmethod
    def from_config(cls, cfg: Any, tokenizer: Any = None) -> SGLangEngine:
        if not cfg.url:
            raise ValueError("engine.url is required for kind 'sglang' (e.g. http://127.0.0.1:30000)")
        return cls(
            cfg.url,
            request_timeout_s=cfg.request_timeout_s,
            max_concurrency=cfg.max_concurrency,
            api_key=cfg.api_key,
            stream=cfg.stream,
            return_routed_experts=cfg.return_routed_experts,
            moe_top_k=cfg.moe_top_k,
            max_context=cfg.max_context or 32768,
        )

    def _body(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "stop": list(params.stop),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        return {
            "input_ids": [int(t) for t in prompt_ids],
            "sampling_params": sampling,
            "return_logprob": True,
            "return_routed_experts": self.return_routed_experts,
            "stream": self.use_stream,
        }

    @property
    def records_routing(self) -> bool:
        return self.return_routed_experts

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        validate_params(params)
        check_prompt(prompt_ids, self.max_context)
        body = self._body(prompt_ids, params)
        emitted = 0
        last: dict[str, Any] | None = None
        if not self.use_stream:
            answer = await self.http.post_json("/generate", body)
            check(
                "sglang",
                "generate response",
                isinstance(answer, dict) and "meta_info" in answer,
                lambda: str(answer)[:300],
            )
            chunks = [answer]
        else:
            chunks = None
        async with _maybe_stream(self, body, chunks) as events:
            async for event in events:
                meta = event.get("meta_info")
                check("sglang", "generate chunk", isinstance(meta, dict), lambda: str(event)[:300])
                for tok, lp in _new_tokens(event, emitted):
                    emitted += 1
                    yield TokenStep(tok, lp)
                last = event
        if last is None or last["meta_info"].get("finish_reason") is None:
            raise EngineError("sglang /generate: the answer ended without a finish_reason")
        meta = last["meta_info"]
        routing = None
        if self.return_routed_experts and meta.get("routed_experts"):
            routing = decode_routing(meta["routed_experts"], len(prompt_ids) + emitted - 1, self.moe_top_k)
        yield TokenStep(None, None, finish_reason(meta["finish_reason"]), routing)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        """Have the server load the HF checkpoint at `path` (a path the server can read)."""
        answer = await self.http.post_json(
            "/update_weights_from_disk", {"model_path": str(path), "weight_version": str(version)}
        )
        if not (isinstance(answer, dict) and answer.get("success")):
            raise EngineError(f"sglang /update_weights_from_disk failed: {answer}")
        self.policy_version = int(version)

    async def close(self) -> None:
        await self.http.close()


def _new_tokens(event: dict[str, Any], emitted: int) -> list[tuple[int, float]]:
    """The tokens of a chunk not yet yielded, whether the chunk is cumulative or a delta."""
    meta = event["meta_info"]
    entries = meta.get("output_token_logprobs") or []
    ids = event.get("output_ids")
    if ids is None:
        ids = [e[1] for e in entries]
    check("sglang", "chunk", len(ids) == len(entries), lambda: f"{len(ids)} output_ids but {len(entries)} logprobs")
    total = meta.get("completion_tokens")
    if total is not None and len(ids) == total:
        ids, entries = ids[emitted:], entries[emitted:]  # cumulative chunk
    out = []
    for tok, entry in zip(ids, entries, strict=True):
        check(
            "sglang",
            "output_token_logprobs entry",
            isinstance(entry, (list, tuple)) and len(entry) >= 2,
            lambda: str(entry),
        )
        check(
            "sglang",
            "output_token_logprobs entry",
            int(entry[1]) == int(tok),
            lambda: f"id {entry[1]} != output id {tok}",
        )
        out.append((int(tok), float(entry[0])))
    return out


class _maybe_stream:
    """`async with`: the SSE events of a streaming call, or the one non-streaming answer."""

    def __init__(self, engine: SGLangEngine, body: dict[str, Any], chunks: list[dict[str, Any]] | None) -> None:
        self.engine, self.body, self.chunks = engine, body, chunks
        self._cm: Any = None

    async def __aenter__(self) -> AsyncIterator[dict[str, Any]]:
        if self.chunks is not None:
            return _iterate(self.chunks)
        self._cm = self.engine.http.stream_json("/generate", self.body)
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        if self._cm is not None:
            await self._cm.__aexit__(*exc)


async def _iterate(chunks: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for c in chunks:
        yield c
