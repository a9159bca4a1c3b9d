"""Relay a sandbox's requests to an external OpenAI- or Anthropic-compatible endpoint.

`legorl eval --endpoint URL` measures a baseline model (any hosted or self-served API)
with the same harnesses, sandboxes and grading as our own engine. The sandbox still has
no network: its session socket serves this relay instead of the proxy. Nothing is
recorded at token level (an external API gives no ids); only outcomes are kept.
"""

from __future__ import annotations

from typing import Any

import httpx

_HOP = {b"host", b"content-length", b"connection", b"transfer-encoding", b"keep-alive", b"authorization", b"x-api-key"}


class PassthroughApp:
    """ASGI app: `/s/<id>/v1/...` or `/v1/...` → `{upstream}/v1/...`, streamed both ways."""

    def __init__(self, upstream: str, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.upstream = upstream.rstrip("/")
        if self.upstream.endswith("/v1"):
            self.upstream = self.upstream[:-3]
        self.api_key = api_key
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path.startswith("/s/"):
            rest = path[3:]
            path = rest[rest.find("/") :] if "/" in rest else "/"
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k not in _HOP]
        if self.api_key:
            headers += [("authorization", f"Bearer {self.api_key}"), ("x-api-key", self.api_key)]
        query = scope.get("query_string", b"").decode()
        url = self.upstream + path + (f"?{query}" if query else "")
        try:
            req = self.client.build_request(scope["method"], url, headers=headers, content=body)
            resp = await self.client.send(req, stream=True)
        except httpx.HTTPError as e:
            err = (
                f'{{"error": {{"message": "upstream {self.upstream} unreachable: {type(e).__name__}", "type": '
                '"api_error"}}}}'
            )
            await send(
                {"type": "http.response.start", "status": 502, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": err.encode()})
            return
        try:
            out_headers = [
                (k.encode(), v.encode())
                for k, v in resp.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding")
            ]
            await send({"type": "http.response.start", "status": resp.status_code, "headers": out_headers})
            async for chunk in resp.aiter_bytes():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await resp.aclose()

    async def aclose(self) -> None:
        await self.client.aclose()
