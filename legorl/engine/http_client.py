"""What the HTTP engines (`vllm`, `sglang`) share: one pooled client, SSE, and errors.

Every failure of a generation server becomes an `EngineError` whose message says which
server, which endpoint and what went wrong (status and the server's own message,
timeout, refused connection, malformed body), because an engine failure is an
infrastructure fault that the rollout layer retries and reports. A prompt the server
rejects as too long for its context is the agent's doing and becomes
`ContextLengthExceeded` instead.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx
import orjson

from legorl.engine.base import ContextLengthExceeded, EngineError

T = TypeVar("T")
_CONTEXT_RE = re.compile(r"context length|maximum context|longer than the model", re.I)


class HTTPEngineClient:
    """An `httpx.AsyncClient` bounded to `max_concurrency` requests in flight."""

    def __init__(self, engine: str, base_url: str, timeout_s: float, max_concurrency: int, api_key: str | None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"{engine} engine url {base_url!r}: expected http://host:port")
        self.engine = engine
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._slots = asyncio.Semaphore(max_concurrency)

    async def post_json(self, path: str, body: dict[str, Any], params: dict[str, Any] | None = None) -> Any:
        """POST a JSON body; the decoded JSON answer (or None for an empty 2xx body)."""
        async with self._slots:
            resp = await self._call(path, self.client.post(path, json=body, params=params))
            raise_for_status(self.engine, path, resp.status_code, resp.content)
            return decode_json(self.engine, path, resp.content) if resp.content.strip() else None

    @asynccontextmanager
    async def stream_json(self, path: str, body: dict[str, Any]) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """POST and iterate the server-sent events' JSON payloads (until `[DONE]`)."""
        async with self._slots:
            request = self.client.build_request("POST", path, json=body)
            resp = await self._call(path, self.client.send(request, stream=True))
            try:
                if resp.status_code >= 400:
                    raise_for_status(self.engine, path, resp.status_code, await resp.aread())
                yield self._events(path, resp)
            finally:
                await resp.aclose()

    async def _events(self, path: str, resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        lines = resp.aiter_lines()
        while True:
            try:
                line = await anext(lines)
            except StopAsyncIteration:
                return
            except httpx.TimeoutException as exc:
                raise EngineError(
                    f"{self.engine} {self.base_url}{path}: stream stalled for over {self.timeout_s}s"
                ) from exc
            except httpx.HTTPError as exc:
                raise EngineError(
                    f"{self.engine} {self.base_url}{path}: stream broke: {type(exc).__name__}: {exc}"
                ) from exc
            if not line.startswith("data:"):
                continue  # blank separators, comments, `event:` lines
            data = line[5:].strip()
            if data == "[DONE]":
                return
            event = decode_json(self.engine, path, data.encode())
            if not isinstance(event, dict):
                raise EngineError(f"{self.engine} {path}: stream event is not a JSON object: {data[:200]}")
            if event.get("object") == "error" or ("error" in event and not ({"choices", "meta_info"} & event.keys())):
                raise EngineError(f"{self.engine} {path}: server reported an error mid-stream: {error_message(event)}")
            yield event

    async def _call(self, path: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except httpx.TimeoutException as exc:
            raise EngineError(f"{self.engine} {self.base_url}{path}: no answer within {self.timeout_s}s") from exc
        except httpx.HTTPError as exc:
            raise EngineError(
                f"{self.engine} {self.base_url}{path}: cannot reach the server ({type(exc).__name__}: {exc}); "
                f"is it running at that address?"
            ) from exc

    async def close(self) -> None:
        await self.client.aclose()


def decode_json(engine: str, path: str, raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EngineError(f"{engine} {path}: malformed JSON from the server: {raw[:200]!r}") from exc


def error_message(body: Any) -> str:
    """The human message inside the error bodies vLLM, SGLang and FastAPI send."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        for key in ("message", "detail"):
            if key in body:
                return str(body[key])
    return str(body)[:500]


def raise_for_status(engine: str, path: str, status: int, raw: bytes) -> None:
    if status < 400:
        return
    try:
        message = error_message(orjson.loads(raw))
    except orjson.JSONDecodeError:
        message = raw[:500].decode(errors="replace")
    if status == 400 and _CONTEXT_RE.search(message):
        raise ContextLengthExceeded(f"{engine}: {message}")
    raise EngineError(f"{engine} {path} answered HTTP {status}: {message}")


def check(engine: str, what: str, cond: bool, detail: Callable[[], str]) -> None:
    """Raise EngineError when a server response lacks what the documented format promises."""
    if not cond:
        raise EngineError(f"{engine}: malformed {what}: {detail()}")
