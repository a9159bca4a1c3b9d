"""The vLLM completions protocol, server side: request parsing and response bodies.

`serve.py` answers our own `vllm` client (and any OpenAI-compatible completions client)
from any Engine, so this module writes exactly the shapes vLLM's
`vllm/entrypoints/openai/completion/{protocol,serving}.py` write and
`legorl/engine/vllm.py` reads:

- request: `prompt` as token ids (one prompt), `max_tokens` (None → the rest of the
  context), `temperature`, `top_p`, `top_k` (absent/0/-1 → off), `stop`, `seed`,
  `logprobs` (0: the sampled token only; this server has no alternatives to list),
  `return_token_ids`, `return_tokens_as_token_ids`, `skip_special_tokens`,
  `include_stop_str_in_output`, `stream`, `stream_options.include_usage`;
- choice: `text`, `logprobs` {`text_offset`, `token_logprobs` (clamped at -9999 as vLLM
  does), `tokens` ("token_id:N" or the token's text), `top_logprobs`}, `finish_reason`,
  `stop_reason` (the matched stop string; None for an end-of-turn id), `token_ids`,
  `prompt_token_ids`, `routed_experts` (non-streaming only: base64 of a `.npy` array of
  shape (prompt + completion − 1, layers, top_k) — vLLM never routes the last sampled
  token, so neither does this server, even when the engine did);
- errors: `{"error": {"message", "type", "param", "code"}}`, with the context-length
  wording the client turns into `ContextLengthExceeded`.
"""

from __future__ import annotations

import base64
import io
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from legorl.types import FinishReason, Routing, SamplingParams

LOGPROB_FLOOR = -9999.0  # vLLM clamps -inf to this so the JSON stays valid


class HTTPError(Exception):
    """A request the server refuses: HTTP status, OpenAI error type, message, offending field."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.status, self.param)


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class CompletionRequest(BaseModel):
    """The fields of vLLM's `CompletionRequest` this server honours (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: list[int] | list[list[int]] | str
    max_tokens: int | None = Field(16, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = None
    n: int = 1
    echo: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None


def parse_request(
    body: Any, served_model: str, max_context: int
) -> tuple[CompletionRequest, list[int], SamplingParams]:
    """Validate a request body; the prompt ids and the sampling parameters, or HTTPError."""
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    try:
        req = CompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise HTTPError(400, f"invalid field {where!r}: {first['msg']}", param=where) from None
    if req.model is not None and req.model != served_model:
        raise HTTPError(404, f"The model `{req.model}` does not exist.", "NotFoundError", "model")
    if isinstance(req.prompt, str):
        raise HTTPError(
            400, "this server generates from token ids: send `prompt` as a list of token ids", param="prompt"
        )
    prompt = req.prompt
    if prompt and isinstance(prompt[0], list):
        if len(prompt) != 1:
            raise HTTPError(400, f"one prompt per request, got {len(prompt)}", param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise HTTPError(400, "`prompt` is empty: at least one prompt token is needed", param="prompt")
    if req.n != 1 or req.echo:
        raise HTTPError(400, "only n = 1 without echo is supported", param="n" if req.n != 1 else "echo")
    if req.logprobs is not None and req.logprobs != 0:
        raise HTTPError(400, "only logprobs = 0 (the sampled token's) is supported", param="logprobs")
    if len(prompt) >= max_context:
        raise HTTPError(400, context_message(max_context, len(prompt), req.max_tokens), param="prompt")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    params = SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if req.top_k in (None, 0, -1) else int(req.top_k),
        max_tokens=req.max_tokens if req.max_tokens is not None else max_context - len(prompt),
        stop=stop,
        seed=req.seed,
    )
    return req, [int(t) for t in prompt], params


def context_message(max_context: int, prompt_tokens: int, max_tokens: int | None) -> str:
    return (
        f"This model's maximum context length is {max_context} tokens. However, you requested "
        f"{prompt_tokens + (max_tokens or 0)} tokens ({prompt_tokens} in the messages, {max_tokens or 0} in the "
        f"completion). Please reduce the length of the messages or completion."
    )


def npy_b64(routing: Routing) -> str:
    """vLLM's `numpy2base64`: base64 of the `.npy` bytes, smallest unsigned dtype that fits."""
    arr = np.asarray(routing, dtype=np.int64)
    top = int(arr.max()) if arr.size else 0
    dtype = np.uint8 if top < 2**8 else np.uint16 if top < 2**16 else np.int32
    buf = io.BytesIO()
    np.save(buf, arr.astype(dtype), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


class Detokenizer:
    """Incremental text of a completion (vLLM's prefix/read offsets): a token that ends in
    the middle of a multi-byte character shows no text until the character is complete."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool) -> None:
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = self._read = 0

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tok.decode(self.ids[self._prefix : self._read], skip_special_tokens=self.skip)
        after = self.tok.decode(self.ids[self._prefix :], skip_special_tokens=self.skip)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta

    def token_text(self, token_id: int) -> str:
        return self.tok.decode([token_id], skip_special_tokens=self.skip)


@dataclass
class Completion:
    """One request's output so far, rendered the way vLLM renders it."""

    req: CompletionRequest
    prompt_ids: list[int]
    detok: Detokenizer
    model: str
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_strs: list[str] = field(default_factory=list)
    sent_text: int = 0  # characters of visible text already streamed
    sent_offset: int = 0  # running logprobs.text_offset

    def add(self, token_id: int, logprob: float) -> None:
        self.ids.append(token_id)
        self.logprobs.append(max(float(logprob), LOGPROB_FLOOR))
        self.detok.add(token_id)
        as_id = self.req.return_tokens_as_token_ids
        self.token_strs.append(f"token_id:{token_id}" if as_id else self.detok.token_text(token_id))

    def stop_reason(self, finish: FinishReason | None) -> str | None:
        if finish != FinishReason.STOP:
            return None
        hit = self._stop_hit()
        return hit[1] if hit else None

    def _stop_hit(self) -> tuple[int, str] | None:
        hits = [(self.detok.text.find(s), s) for s in self.stop_strings if s in self.detok.text]
        return min(hits) if hits else None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        s = self.req.stop
        return (s,) if isinstance(s, str) else tuple(s or ())

    def visible_text(self, finished: bool) -> str:
        """The text a client may see: cut at a matched stop string (kept only with
        `include_stop_str_in_output`); while streaming, the tail that could still become a
        stop string is held back, as vLLM does."""
        text = self.detok.text
        hit = self._stop_hit()
        if hit is not None:
            return text[: hit[0] + (len(hit[1]) if self.req.include_stop_str_in_output else 0)]
        if not finished and self.stop_strings:
            hold = max(len(s) for s in self.stop_strings) - 1
            return text[: max(len(text) - hold, self.sent_text)]
        return text

    def logprobs_block(self, start: int, end: int) -> dict[str, Any] | None:
        if self.req.logprobs is None:
            return None
        offsets, off = [], self.sent_offset
        for tok in self.token_strs[start:end]:
            offsets.append(off)
            off += len(tok)
        self.sent_offset = off
        return {
            "text_offset": offsets,
            "token_logprobs": self.logprobs[start:end],
            "tokens": self.token_strs[start:end],
            "top_logprobs": [
                {t: lp} for t, lp in zip(self.token_strs[start:end], self.logprobs[start:end], strict=True)
            ],
        }

    def usage(self) -> dict[str, int]:
        p, c = len(self.prompt_ids), len(self.ids)
        return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}

    def response(self, finish: FinishReason, routing: Routing | None) -> dict[str, Any]:
        """The non-streaming `CompletionResponse`."""
        with_ids = self.req.return_token_ids
        rows = len(self.prompt_ids) + len(self.ids) - 1
        choice = {
            "index": 0,
            "text": self.visible_text(True),
            "logprobs": self.logprobs_block(0, len(self.ids)),
            "finish_reason": finish.value,
            "stop_reason": self.stop_reason(finish),
            "token_ids": list(self.ids) if with_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": list(self.prompt_ids) if with_ids else None,
            "routed_experts": npy_b64(routing[:rows]) if routing is not None and len(routing) else None,
        }
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {**self.usage(), "prompt_tokens_details": None},
            "kv_transfer_params": None,
        }

    def chunk(self, start: int, finish: FinishReason | None) -> dict[str, Any]:
        """One `CompletionStreamResponse` carrying tokens `start:` (the delta since the last chunk)."""
        visible = self.visible_text(finish is not None)
        delta, self.sent_text = visible[self.sent_text :], max(self.sent_text, len(visible))
        choice: dict[str, Any] = {
            "index": 0,
            "text": delta,
            "logprobs": self.logprobs_block(start, len(self.ids)),
            "finish_reason": finish.value if finish is not None else None,
            "stop_reason": self.stop_reason(finish),
        }
        if self.req.return_token_ids:
            choice["token_ids"] = self.ids[start:]
            if start == 0:
                choice["prompt_token_ids"] = list(self.prompt_ids)
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def usage_chunk(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage(),
        }
