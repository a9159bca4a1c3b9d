"""`vllm`: token-in/token-out client of a vLLM OpenAI-compatible server.

Request (`POST /v1/completions`, vllm-project/vllm
`vllm/entrypoints/openai/completion/protocol.py::CompletionRequest`):
`prompt` is the list of token ids (no re-tokenisation on the server), `logprobs: 0` asks
for the sampled token's logprob only, `return_token_ids: true` returns the completion ids
(`choices[].token_ids`), and `return_tokens_as_token_ids: true` makes
`logprobs.tokens[i]` the string `"token_id:<id>"` (used when a server predates
`return_token_ids`). `skip_special_tokens: false` so end-of-turn tokens stay in the text.

Streaming (`stream: true`, `vllm/entrypoints/openai/completion/serving.py`): SSE
`data: {CompletionStreamResponse}` chunks whose `choices[0]` carry the *delta* `token_ids`
and `logprobs`, the last one a `finish_reason` ("stop" | "length" | "abort"), then a usage
chunk with `choices: []`, then `data: [DONE]`; an error mid-stream arrives as
`data: {"error": {...}}`.

Routed experts (server started with `--enable-return-routed-experts`): only the
non-streaming `CompletionResponseChoice.routed_experts` carries them, as base64 of a
numpy `.npy` file of shape (prompt + completion - 1, layers, top_k) — the last sampled
token is never forwarded. With `return_routed_experts` this client therefore asks
without streaming and yields all tokens when the answer arrives.

Logprob meaning: vLLM reports raw `log_softmax(logits)` unless the server is started with
`--logprobs-mode processed_logprobs`, which gives the temperature/top-k/top-p-processed
distribution that `legorl.engine.sampling` defines. Start it that way for training.

Weight sync from disk: vLLM has no "load this path" endpoint. The documented RL pattern
(dev mode, `VLLM_SERVER_DEV_MODE=1`; `vllm/entrypoints/serve/dev/rpc/api_router.py`,
`.../dev/cache/api_router.py`, `.../dev/rlhf/api_router.py`) is: write the new weights into
the directory the server was launched on, then `POST /collective_rpc
{"method": "reload_weights"}` (the worker re-reads that directory), `POST
/reset_prefix_cache?reset_running_requests=true` (no KV computed by old weights survives),
and `POST /update_weight_version {"new_version": ...}`. So `update_weights_from_disk`
requires `path` to be that served directory (`served_model_dir`).
"""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from legorl.engine.base import EngineError, check_prompt, collect
from legorl.engine.http_client import HTTPEngineClient, check
from legorl.engine.sampling import validate_params
from legorl.types import FinishReason, Generation, Routing, SamplingParams, TokenStep, as_routing

FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def finish_reason(engine: str, value: Any) -> FinishReason:
    if value in FINISH:
        return FINISH[value]
    raise EngineError(f"{engine}: generation ended with finish_reason {value!r}")


def decode_npy_b64(data: str) -> Routing:
    """vLLM's routed experts: base64 of `.npy` bytes → int16 array (token, layer, k)."""
    try:
        arr = np.load(io.BytesIO(base64.b64decode(data)), allow_pickle=False)
    except Exception as exc:
        raise EngineError(f"vllm: routed_experts is not base64 of a .npy array: {exc}") from exc
    if arr.ndim != 3:
        raise EngineError(f"vllm: routed_experts has shape {arr.shape}, expected (tokens, layers, top_k)")
    return as_routing(arr)


class VLLMEngine:
    """Client of one vLLM server; generation by token ids."""

    name = "vllm"

    def __init__(
        self,
        url: str,
        served_model_name: str,
        *,
        request_timeout_s: float = 600.0,
        max_concurrency: int = 256,
        api_key: str | None = None,
        stream: bool = True,
        return_routed_experts: bool = False,
        max_context: int = 32768,
        served_model_dir: str | None = None,
    ) -> None:
        self.http = HTTPEngineClient("vllm", url, request_timeout_s, max_concurrency, api_key)
        self.served_model_name = served_model_name
        self.use_stream = stream and not return_routed_experts
        self.return_routed_experts = return_routed_experts
        self.max_context = max_context
        self.served_model_dir = served_model_dir
        self.policy_version = 0

    @classmethod
    def from_config(cls, cfg: Any, tokenizer: Any = None) -> VLLMEngine:
        if not cfg.url:
            raise ValueError("engine.url is required for kind 'vllm' (e.g. http://127.0.0.1:8000)")
        return cls(
            cfg.url,
            cfg.served_model_name or cfg.model,
            request_timeout_s=cfg.request_timeout_s,
            max_concurrency=cfg.max_concurrency,
            api_key=cfg.api_key,
            stream=cfg.stream,
            return_routed_experts=cfg.return_routed_experts,
            max_context=cfg.max_context or 32768,
            served_model_dir=cfg.served_model_dir,
        )

    def _body(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.served_model_name,
            "prompt": [int(t) for t in prompt_ids],
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": list(params.stop),
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stream": self.use_stream,
        }
        if params.top_k > 0:  # "off" is -1 on older servers, 0 on newer: leave it to the default
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        if self.use_stream:
            body["stream_options"] = {"include_usage": True}
        return body

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        validate_params(params)
        check_prompt(prompt_ids, self.max_context)
        body = self._body(prompt_ids, params)
        if not self.use_stream:
            answer = await self.http.post_json("/v1/completions", body)
            choice = _choice(answer)
            ids, lps = _ids_and_logprobs(choice)
            for tok, lp in zip(ids, lps, strict=True):
                yield TokenStep(tok, lp)
            routing = None
            if self.return_routed_experts and choice.get("routed_experts") is not None:
                routing = decode_npy_b64(choice["routed_experts"])
            yield TokenStep(None, None, finish_reason("vllm", choice.get("finish_reason")), routing)
            return
        finish: FinishReason | None = None
        async with self.http.stream_json("/v1/completions", body) as events:
            async for event in events:
                choices = event.get("choices")
                check("vllm", "stream chunk", isinstance(choices, list), lambda: str(event)[:300])
                for choice in choices:
                    ids, lps = _ids_and_logprobs(choice)
                    for tok, lp in zip(ids, lps, strict=True):
                        yield TokenStep(tok, lp)
                    if choice.get("finish_reason") is not None:
                        finish = finish_reason("vllm", choice["finish_reason"])
        if finish is None:
            raise EngineError("vllm /v1/completions: the stream ended without a finish_reason")
        yield TokenStep(None, None, finish)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        """Reload the weights the trainer wrote into the served directory; set the version."""
        if self.served_model_dir is None:
            raise ValueError("vllm update_weights_from_disk needs engine.served_model_dir (the directory vLLM serves)")
        if Path(path).resolve() != Path(self.served_model_dir).resolve():
            raise ValueError(
                f"vllm reloads weights only from the directory it was launched on ({self.served_model_dir}); "
                f"write the new weights there instead of {path}"
            )
        await self.http.post_json("/collective_rpc", {"method": "reload_weights"})
        await self.http.post_json("/reset_prefix_cache", {}, params={"reset_running_requests": "true"})
        await self.http.post_json("/update_weight_version", {"new_version": str(version)})
        self.policy_version = int(version)

    async def close(self) -> None:
        await self.http.close()


def _choice(answer: Any) -> dict[str, Any]:
    ok = isinstance(answer, dict) and isinstance(answer.get("choices"), list) and len(answer["choices"]) == 1
    check("vllm", "completion response", ok, lambda: str(answer)[:300])
    return answer["choices"][0]


def _ids_and_logprobs(choice: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Token ids (from `token_ids`, else from "token_id:N" strings) and their logprobs."""
    lp = choice.get("logprobs") or {}
    logprobs = lp.get("token_logprobs") or []
    ids = choice.get("token_ids")
    if ids is None:
        tokens = lp.get("tokens") or []
        try:
            ids = [int(t.split("token_id:", 1)[1]) for t in tokens]
        except (IndexError, ValueError, AttributeError) as exc:
            raise EngineError(f"vllm: logprobs.tokens are not 'token_id:N' strings: {tokens[:3]}") from exc
    check("vllm", "choice", len(ids) == len(logprobs), lambda: f"{len(ids)} token ids but {len(logprobs)} logprobs")
    check("vllm", "logprobs", all(x is not None for x in logprobs), lambda: "a sampled token has no logprob")
    return [int(t) for t in ids], [float(x) for x in logprobs]

