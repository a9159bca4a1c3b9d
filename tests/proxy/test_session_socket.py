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
