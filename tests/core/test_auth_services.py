"""Authenticated by default (issue 39, item 2): the standalone proxy, the UI and `engine-serve`
ask for a token unless started `--insecure` on loopback, refuse a `Host` that is not their
bound address (DNS rebinding), and `engine-serve` refuses admin inputs no run would send."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from legorl.engine.registry import EngineConfig
from legorl.engine.scripted import ScriptedEngine
from legorl.engine.serve import EngineServer, serve_engine
from legorl.http_auth import new_token, policy
from legorl.models import load_tokenizer
from legorl.monitor.demo import write_demo_run
from legorl.monitor.ui.server import UIServerThread, serve_ui
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.store.run_store import RunStore

TOK = load_tokenizer("tiny-qwen3")
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def rebinding(port: int) -> dict[str, str]:
    return {"host": f"attacker.example:{port}"}


# -- the standalone proxy ----------------------------------------------------------------------


async def test_standalone_proxy_needs_its_token_and_its_own_host() -> None:
    srv = ProxyServer(ProxyConfig(port=0), ScriptedEngine(["ok"], TOK), ChatMLRenderer(TOK), standalone=True)
    srv.app.secret = srv.secret = "tok"
    async with srv, httpx.AsyncClient(base_url=srv.base_url, timeout=30) as c:
        assert (await c.post("/v1/chat/completions", json=BODY, headers={"x-api-key": "alpha"})).status_code == 401
        assert (await c.get("/legorl/sessions")).status_code == 401
        assert not srv.sessions.open_sessions  # a refused call opens nothing
        ok = await c.post("/v1/chat/completions", json=BODY, headers={"authorization": "Bearer tok:alpha"})
        assert ok.status_code == 200 and list(srv.sessions.open_sessions) == ["alpha"]
        by_url = await c.post("/s/beta/v1/messages", json=BODY, headers={"x-api-key": "tok"})
        assert by_url.status_code == 200 and "beta" in srv.sessions.open_sessions
        no_session = await c.post("/v1/chat/completions", json=BODY, headers={"authorization": "Bearer tok"})
        assert no_session.status_code == 401  # the token alone names no session
        health = (await c.get("/health")).json()
        assert health == {"status": "ok"}  # liveness is open, the session count is not
        h = {"authorization": "Bearer tok:alpha", **rebinding(srv.port)}
        assert (await c.post("/v1/chat/completions", json=BODY, headers=h)).status_code == 403
        assert (await c.get("/health", headers=rebinding(srv.port))).status_code == 403


def test_policy_insecure_only_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEGORL_TOKEN", raising=False)
    assert policy("proxy", "127.0.0.1", None, insecure=True) is None
    assert policy("proxy", "::1", "given", insecure=False) == "given"
    assert len(policy("proxy", "0.0.0.0", None, insecure=False) or "") >= 32  # a fresh one
    monkeypatch.setenv("LEGORL_TOKEN", "from-env")
    assert policy("ui", "127.0.0.1", None, insecure=False) == "from-env"
    with pytest.raises(SystemExit, match="loopback only"):
        policy("ui", "0.0.0.0", None, insecure=True)
    with pytest.raises(SystemExit, match="only letters"):
        policy("proxy", "127.0.0.1", "a:b", insecure=False)  # ':' separates the session in a key


def test_a_fresh_token_never_begins_with_a_dash() -> None:
    """URL-safe base64 begins with "-" one time in 64; a command line would read such a token
    after `--token` or `--api-key` as an option (every warm OpenHands rollout of such a run
    waited out its timeout)."""
    tokens = [new_token() for _ in range(4000)]  # ~62 would begin with "-" otherwise
    assert not [t for t in tokens if t.startswith("-")]
    assert len(set(tokens)) == 4000 and min(map(len, tokens)) >= 43


def test_cli_refuses_insecure_off_loopback_in_one_line(tmp_path: Path) -> None:
    legorl = [sys.executable, "-m", "legorl.cli"]
    r = subprocess.run(
        [*legorl, "proxy", "--host", "0.0.0.0", "--insecure", "--engine", "scripted", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "loopback only" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


# -- engine-serve ------------------------------------------------------------------------------


async def test_engine_serve_key_host_and_weight_versions() -> None:
    engine = ScriptedEngine(["ok"], TOK)
    async with EngineServer(engine, TOK, "tiny-qwen3", api_key="k3y") as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            auth = {"authorization": "Bearer k3y"}
            assert (await c.post("/update_weight_version", json={"new_version": 3})).status_code == 401
            assert (await c.post("/collective_rpc", json={"method": "reload_weights"})).status_code == 401
            wrong = {"authorization": "Bearer k3y-not"}
            assert (await c.post("/update_weight_version", json={"new_version": 3}, headers=wrong)).status_code == 401
            h = {**auth, **rebinding(srv.port)}
            assert (await c.get("/get_weight_version", headers=h)).status_code == 403
            for bad in (-7, 10**26, "10" * 20, True, 1.5, "abc", None, "-1", [1]):
                r = await c.post("/update_weight_version", json={"new_version": bad}, headers=auth)
                assert r.status_code == 400 and "new_version" in r.text, (bad, r.text)
            assert engine.policy_version == 0
            for good, want in ((7, 7), ("12", 12), (0, 0)):
                r = await c.post("/update_weight_version", json={"new_version": good}, headers=auth)
                assert r.status_code == 200 and engine.policy_version == want, r.text


def test_engine_serve_refuses_an_open_bind_off_loopback() -> None:
    cfg = EngineConfig(kind="scripted", model="tiny-qwen3", scripted_completions=["ok"])
    with pytest.raises(SystemExit, match="--api-key"):
        serve_engine(cfg, "0.0.0.0", 0)
    with pytest.raises(SystemExit, match="--api-key"):
        serve_engine(cfg, "0.0.0.0", 0, insecure=True)


# -- the UI ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("runs") / "r"
    store = RunStore(d, durable=False)
    write_demo_run(store, steps=2, tasks=2, group_size=2, seed=1)
    yield d
    store.close()


def test_ui_token_travels_once_in_the_url_then_in_a_cookie(run_dir: Path) -> None:
    with UIServerThread(run_dir, poll_interval=0.1) as srv, httpx.Client(timeout=10) as c:
        assert srv.token and srv.url == f"{srv.base_url}?token={srv.token}"
        refused = c.get(srv.base_url + "api/run")
        assert refused.status_code == 401 and "token" in refused.json()["error"]
        assert c.get(srv.base_url).status_code == 401
        wrong = c.get(srv.base_url + "?token=nope")
        assert wrong.status_code == 401
        first = c.get(srv.url)  # what the console printed
        assert first.status_code == 303 and first.headers["location"] == "/"
        cookie = first.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert c.get(srv.base_url + "api/run").status_code == 200  # the client kept the cookie
        bearer = httpx.get(srv.base_url + "api/run", headers={"authorization": f"Bearer {srv.token}"})
        assert bearer.status_code == 200
        port = int(srv.base_url.rsplit(":", 1)[1].strip("/"))
        assert c.get(srv.base_url + "api/run", headers=rebinding(port)).status_code == 403


def test_ui_insecure_is_open_on_loopback_only(run_dir: Path) -> None:
    with UIServerThread(run_dir, insecure=True) as srv:
        assert srv.url == srv.base_url and httpx.get(srv.url + "api/run", timeout=10).status_code == 200
        port = int(srv.base_url.rsplit(":", 1)[1].strip("/"))
        assert httpx.get(srv.url + "api/run", headers=rebinding(port), timeout=10).status_code == 403
    with pytest.raises(SystemExit, match="loopback only"):
        serve_ui(run_dir, "0.0.0.0", 0, insecure=True)
