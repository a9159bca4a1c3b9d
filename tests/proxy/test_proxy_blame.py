"""Whose fault a failed call is (`legorl/proxy/blame.py`), call by call on a real proxy: a
session's own load, a client that stops reading or hangs up mid-stream, a WebSocket upgrade
or a malformed request are never counted as ours, and none of them writes a warning on the
trainer's console (issue 39, items 1 and 7)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from legorl.engine.scripted import ScriptedEngine
from legorl.models import load_tokenizer
from legorl.proxy import app as app_mod
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.proxy.session_socket import SessionSocket
from legorl.types import SamplingParams, TokenStep

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}


class Slow(ScriptedEngine):
    """Scripted, one token every `per_token_s`: a stream that takes its time."""

    def __init__(self, per_token_s: float, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.per_token_s = per_token_s

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        async for step in super().stream(prompt_ids, params):
            await asyncio.sleep(self.per_token_s)
            yield step


def proxy(per_token_s: float = 0.0, **cfg: Any) -> ProxyServer:
    tok = load_tokenizer("tiny-qwen3")
    engine = Slow(per_token_s, [" ".join(["word"] * 150)], tok)
    return ProxyServer(ProxyConfig(port=0, **cfg), engine, ChatMLRenderer(tok))


async def test_past_the_session_limit_a_429_that_names_the_setting() -> None:
    async with proxy(0.02, session_max_concurrency=2) as srv:
        s = srv.open_session("busy")
        async with httpx.AsyncClient(base_url=srv.session_url("busy"), timeout=30) as c:
            rs = await asyncio.gather(*(c.post("/v1/chat/completions", json=BODY) for _ in range(4)))
            anth = await asyncio.gather(
                *(c.post("/v1/messages", json={**BODY, "max_tokens": 50}) for _ in range(3)),
            )
        codes = sorted(r.status_code for r in rs)
        assert codes == [200, 200, 429, 429], [r.text for r in rs]
        err = next(r for r in rs if r.status_code == 429).json()["error"]
        assert err["type"] == "rate_limit_error" and err["code"] == "session_concurrency_limit"
        assert "session_max_concurrency" in err["message"]
        refused = next(r for r in anth if r.status_code == 429).json()
        assert refused["type"] == "error" and refused["error"]["type"] == "rate_limit_error"
        assert s.engine_errors == 0 and s.agent_faults["concurrency_limit"] == 3 and s.in_flight == 0


async def test_a_client_that_stops_reading_is_the_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request timer fires while the proxy waits for the client to take its stream: the
    client's doing (`slow_read`), and the answer that follows cannot hold the call forever."""
    monkeypatch.setattr(app_mod, "_ERROR_SEND_S", 0.2)
    async with proxy(0.0, request_timeout_s=0.5) as srv:
        s = srv.open_session("reader")
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if not sent and not getattr(receive, "done", False):
                receive.done = True  # type: ignore[attr-defined]
                return {"type": "http.request", "body": orjson.dumps({**BODY, "stream": True}), "more_body": False}
            await asyncio.sleep(3600)  # the client never hangs up
            raise AssertionError

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)
            if msg["type"] == "http.response.body" and len(sent) > 2:
                await asyncio.sleep(3600)  # a full socket: the client reads nothing more

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/s/reader/v1/chat/completions",
            "headers": [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")],
            "query_string": b"",
        }
        await asyncio.wait_for(srv.app(scope, receive, send), 10)
        assert s.engine_errors == 0 and s.agent_faults == {"slow_read": 1}, s.summary()


async def test_a_client_that_hangs_up_mid_stream_costs_nothing(tmp_path: Path) -> None:
    async with proxy(0.02) as srv:
        s = srv.open_session("gone")
        async with httpx.AsyncClient(base_url=srv.session_url("gone"), timeout=30) as c:
            async with c.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as r:
                async for _ in r.aiter_bytes():
                    break  # one chunk, then the socket is closed
        for _ in range(100):
            if s.in_flight == 0:
                break
            await asyncio.sleep(0.05)
        assert s.in_flight == 0 and s.engine_errors == 0 and not s.agent_faults, s.summary()
        assert len(s.aborted) == 1 and not s.turns  # kept as aborted, never trained on


class StallsAfter(ScriptedEngine):
    """Scripted, but silent after its first `n` tokens: an engine that stalls mid-answer."""

    def __init__(self, n: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.n = n

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        k = 0
        async for step in super().stream(prompt_ids, params):
            if k == self.n:
                await asyncio.sleep(3600)
            k += 1
            yield step


@pytest.mark.parametrize("n", [0, 3], ids=["before_its_first_token", "mid_answer"])
async def test_a_lone_call_the_engine_stops_serving_is_ours(n: int) -> None:
    tok = load_tokenizer("tiny-qwen3")
    engine = StallsAfter(n, [" ".join(["word"] * 150)], tok)
    async with ProxyServer(ProxyConfig(port=0, request_timeout_s=0.4), engine, ChatMLRenderer(tok)) as srv:
        s = srv.open_session("alone")
        async with httpx.AsyncClient(base_url=srv.session_url("alone"), timeout=30) as c:
            r = await c.post("/v1/chat/completions", json={**BODY, "stream": bool(n)})
        if n:  # the stream had begun: it ends with the error event
            assert r.status_code == 200 and b"did not finish" in r.content, r.content[-300:]
        else:
            assert r.status_code == 504, r.text
        assert s.engine_errors == 1 and not s.agent_faults, s.summary()


async def test_a_policy_that_will_not_stop_before_the_timeout_is_the_agents() -> None:
    """The engine kept giving tokens until the request timer fired: the policy's length, not an
    engine fault (a policy that rambles into the timeout must not escape its zero)."""
    async with proxy(0.05, request_timeout_s=0.3) as srv:
        s = srv.open_session("ramble")
        async with httpx.AsyncClient(base_url=srv.session_url("ramble"), timeout=30) as c:
            r = await c.post("/v1/chat/completions", json=BODY)
        assert r.status_code == 504 and s.engine_errors == 0 and s.agent_faults == {"long_generation": 1}


UPGRADE = (
    b"GET /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
MALFORMED = [
    b"GARBAGE\x00 / HTTP/1.1\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n",
]


async def _raw(open_conn: Any, data: bytes) -> bytes:
    reader, writer = await open_conn()
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


@pytest.mark.parametrize("via", ["sandbox_socket", "tcp"])
async def test_websocket_and_malformed_requests_are_answered_quietly(
    tmp_path: Path, via: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with proxy() as srv:
        srv.open_session("quiet")
        sock = tmp_path / "s.sock"
        async with SessionSocket(srv.app, "quiet", sock):
            # uvicorn's loggers print on the console themselves, not through the root logger (and
            # each server's start configures them afresh): listen on them once both are up
            for name in ("uvicorn", "uvicorn.error"):
                logging.getLogger(name).addHandler(caplog.handler)
            if via == "tcp":
                conn = lambda: asyncio.open_connection("127.0.0.1", srv.port)  # noqa: E731
            else:
                conn = lambda: asyncio.open_unix_connection(str(sock))  # noqa: E731
            answers = [await _raw(conn, UPGRADE)] + [await _raw(conn, m) for m in MALFORMED]
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).removeHandler(caplog.handler)
    for a in answers:
        status = int(a.split(b" ", 2)[1]) if a.startswith(b"HTTP/1.1 ") else 0
        assert 400 <= status < 500, a[:200]
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not loud, [(r.name, r.getMessage()) for r in loud]
