"""A sandbox's unix socket reaches its own session only, whatever path or key it sends."""

from __future__ import annotations

import httpx

from legorl.engine.scripted import ScriptedEngine
from legorl.models import load_tokenizer
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.proxy.session_socket import SessionSocket


async def test_socket_is_pinned_to_its_session(tmp_path) -> None:
    tok = load_tokenizer("tiny-qwen3")
    engine = ScriptedEngine(["hello there"], tok)
    async with ProxyServer(ProxyConfig(port=0), engine, ChatMLRenderer(tok)) as srv:
        srv.open_session("mine")
        srv.open_session("theirs")
        path = tmp_path / "s.sock"
        async with SessionSocket(srv.app, "mine", path):
            transport = httpx.AsyncHTTPTransport(uds=str(path))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                r1 = await c.post("/v1/chat/completions", json=body)
                r2 = await c.post(
                    "/s/theirs/v1/chat/completions", json=body, headers={"authorization": "Bearer theirs"}
                )
                assert r1.status_code == r2.status_code == 200, (r1.text, r2.text)
                r3 = await c.delete("/legorl/sessions/theirs")
                r4 = await c.get("/s/x/legorl/sessions")
                assert r3.status_code == r4.status_code == 403 and "management" in r3.json()["error"]["message"]
        mine, theirs = srv.close_session("mine"), srv.close_session("theirs")
        assert len(mine) == 2 and len(theirs) == 0
        assert not path.exists()


async def test_an_idle_connection_outlives_the_clients_own_keep_alive(tmp_path) -> None:
    """The socket keeps an idle connection open longer than clients keep theirs (Node's
    undici: 4 s), so it never closes one under a harness that is reusing it: uvicorn's own
    5 s did, and the request that met the close was reset (tests/sandbox/test_forwarder.py)."""
    import asyncio
    import json

    tok = load_tokenizer("tiny-qwen3")
    engine = ScriptedEngine(["one", "two"], tok)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )

    async def answer(reader: asyncio.StreamReader) -> bytes:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        size = next(int(v) for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"content-length")
        return head.split(b"\r\n")[0] + b" " + await reader.readexactly(size)

    async with ProxyServer(ProxyConfig(port=0), engine, ChatMLRenderer(tok)) as srv:
        srv.open_session("mine")
        path = tmp_path / "s.sock"
        async with SessionSocket(srv.app, "mine", path):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(request)
            first = await answer(reader)
            await asyncio.sleep(6)  # idle past uvicorn's default keep-alive
            writer.write(request)
            second = await answer(reader)
            writer.close()
        srv.close_session("mine")
    assert first.startswith(b"HTTP/1.1 200") and b"one" in first
    assert second.startswith(b"HTTP/1.1 200") and b"two" in second
