"""Run the proxy: in-process for rollouts (`ProxyServer`), or standalone (`legorl proxy`).

In-process, the proxy shares the caller's event loop and engine object (an HF engine
batches every session's calls together); uvicorn serves it on a loopback socket bound
here, so the port is known before the first request and `port=0` is race-free. uvloop
and httptools are used whenever they are installed (they cut the per-request CPU of the
HTTP layer roughly in half).

    async with ProxyServer(cfg, engine, renderer) as srv:
        session = srv.open_session("rollout-17", {"instance_id": ...})
        ...  # harness uses f"{srv.base_url}/s/rollout-17" (or base_url + key "rollout-17")
        turns = srv.close_session("rollout-17")
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from pathlib import Path
from typing import Any

from legorl.asgi_serve import LoopServer, tcp_server
from legorl.engine.base import Engine
from legorl.http_auth import HostCheck
from legorl.proxy.app import ProxyApp
from legorl.proxy.config import ProxyConfig
from legorl.proxy.context import ProxyContext
from legorl.proxy.renderer import Renderer
from legorl.proxy.renderer_choice import make_renderer
from legorl.proxy.sessions import JsonlRecorder, Session, SessionRegistry
from legorl.types import Turn

log = logging.getLogger(__name__)


def tune_gc(gen0_threshold: int = 50_000) -> None:
    """Keep the cyclic GC off the request path.

    A loaded engine leaves ~10^5–10^6 long-lived objects (torch, transformers); every full
    collection walks all of them, which cost the proxy ~0.3–0.5 ms per request. Freezing
    moves what exists now out of the collector's view (it is still freed by refcount), and
    a larger first-generation threshold makes collections rarer: request objects are
    acyclic and die by refcount anyway."""
    gc.collect()
    gc.freeze()
    g0, g1, g2 = gc.get_threshold()
    gc.set_threshold(max(g0, gen0_threshold), g1, g2)


class ProxyServer:
    """The proxy on a loopback port, sharing the caller's event loop.

    `standalone=False` (default): sessions exist only between `open_session` and
    `close_session`. `standalone=True`: any session id is opened on first use.
    With `secret`, every request on the TCP port but liveness must carry it as its API key
    (`Bearer <secret>`, the session in the URL, or `Bearer <secret>:<session>`); requests on a
    session socket never need it. On loopback the `Host` header must name the bound address.
    With `out_dir`, every finished turn is appended to `out_dir/turns.jsonl` and every
    closed session's trajectory to `out_dir/trajectories.jsonl`."""

    def __init__(
        self,
        cfg: ProxyConfig,
        engine: Engine,
        renderer: Renderer,
        *,
        out_dir: Path | None = None,
        standalone: bool = False,
        host: str | None = None,
        port: int | None = None,
        secret: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.recorder = JsonlRecorder(out_dir) if out_dir is not None else None
        self.sessions = SessionRegistry(standalone=standalone, recorder=self.recorder, idle_s=cfg.session_idle_s)
        self.ctx = ProxyContext(cfg, engine, renderer, self.sessions)
        self.host = host if host is not None else cfg.host
        self.port = port if port is not None else cfg.port
        self.secret = secret
        self.hosts = HostCheck(self.host)
        self.app = ProxyApp(self.ctx, secret=secret, hosts=self.hosts)
        self._server: LoopServer | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def session_url(self, session_id: str) -> str:
        """Base URL (without /v1) that routes every call to this session."""
        return f"{self.base_url}/s/{session_id}"

    # -- sessions (managed mode) ------------------------------------------------------------
    def open_session(self, session_id: str, meta: dict[str, Any] | None = None) -> Session:
        return self.sessions.open(session_id, meta, managed=True)

    def close_session(self, session_id: str) -> list[Turn]:
        """Close the session and return its delivered turns in call order (side calls
        included, flagged); aborted calls are in `Session.aborted`."""
        return self.sessions.close(session_id).sorted_turns()

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self.cfg.tune_gc:
            tune_gc()
        self._server = tcp_server(
            self.app, self.host, self.port, what="proxy server", header_timeout_s=self.cfg.header_timeout_s
        )
        self.port = self._server.sock.getsockname()[1]
        self.hosts.bound(self.port)
        await self._server.start()

    async def stop(self) -> None:
        """Stop serving, close every open session (writing its trajectory) and the files."""
        if self._server is not None:
            await self._server.stop()
            self._server = None
        self.ctx.offload.close()
        self.shutdown_sessions()

    def shutdown_sessions(self) -> None:
        for s in self.sessions.close_all():
            log.info("closed session %s at shutdown (%d turns)", s.id, len(s.turns))
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = self.sessions.recorder = None

    async def __aenter__(self) -> ProxyServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def run_standalone(
    engine_kind: str,
    model: str,
    host: str,
    port: int,
    out: Path,
    config_path: Path | None,
    *,
    token: str | None = None,
    insecure: bool = False,
) -> None:
    """`legorl proxy`: serve all three dialects until SIGINT/SIGTERM, recording to `out`.

    Authenticated by default (`legorl/http_auth.py`): every call carries `token` (else
    `$LEGORL_TOKEN`, else a fresh one, printed) as its API key, the session in the URL or
    after the token (`<token>:<session>`); `insecure=True` serves without one, on loopback only.

    `config_path` is a TOML file whose `[proxy]` table holds ProxyConfig fields and whose
    `[engine]` table holds EngineConfig fields (other tables are ignored). Any session id
    is accepted and opened on first use; `DELETE /legorl/sessions/{id}` or shutdown writes
    its trajectory."""
    from pydantic import ValidationError

    from legorl.engine.registry import EngineConfig, make_engine
    from legorl.http_auth import policy
    from legorl.models import load_tokenizer

    secret = policy("proxy", host, token, insecure)
    proxy_cfg, engine_raw = _load_config(config_path)
    proxy_cfg.host, proxy_cfg.port = host, port
    try:
        tokenizer = load_tokenizer(model)
        engine = make_engine(EngineConfig(**{**engine_raw, "kind": engine_kind, "model": model}), tokenizer)
    except (ValidationError, ValueError) as e:  # bad [engine] table, unknown model or engine kind
        raise SystemExit(f"legorl proxy: cannot start the {engine_kind!r} engine for {model!r}: {e}") from None
    try:
        renderer = make_renderer(tokenizer)
    except ValueError as e:  # TemplateError: a chat template shape the proxy refuses to guess
        raise SystemExit(f"legorl proxy: cannot render prompts for {model!r}: {e}") from None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        srv = ProxyServer(proxy_cfg, engine, renderer, out_dir=out, standalone=True, secret=secret)
        try:
            await srv.start()
        except OSError as e:  # port in use, address not available: a message, not a traceback
            raise SystemExit(f"legorl proxy: {e}") from None
        print(
            f"legorl proxy: serving {engine_kind}:{model} at {srv.base_url} "
            f"(OpenAI {srv.base_url}/v1, Anthropic {srv.base_url}); recording to {out}",
            flush=True,
        )
        if secret is None:
            print("legorl proxy: --insecure: no token is asked (any local process can use it)", flush=True)
        elif secret != token:
            print(
                f"legorl proxy: token {secret} (send it as the API key, the session after it: "
                f"<token>:<session>, or in the URL: {srv.base_url}/s/<session>)",
                flush=True,
            )
        try:
            await stop.wait()
        finally:
            await srv.stop()
            close = getattr(engine, "close", None)
            if close is not None:
                await close()
            print("legorl proxy: stopped; trajectories written", flush=True)

    _run(main())


def _run(coro: Any) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


def _load_config(path: Path | None) -> tuple[ProxyConfig, dict[str, Any]]:
    if path is None:
        return ProxyConfig(), {}
    import tomllib

    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise SystemExit(f"config file {path} is not valid TOML: {e}") from None
    engine_raw = dict(data.get("engine", {}))
    raw = data.get("proxy", {})
    from pydantic import ValidationError

    try:
        return ProxyConfig(**raw), engine_raw
    except ValidationError as e:
        raise SystemExit(f"config file {path}, [proxy]: {e}") from None
