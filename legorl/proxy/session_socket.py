"""A unix socket that reaches exactly one proxy session: a sandbox's only way out.

A sandbox has no network. Its forwarder turns `http://127.0.0.1:<port>` inside into this
socket outside (bind-mounted into the sandbox), so an unmodified harness needs nothing but
a base URL. Whatever path or API key the agent sends, every request on the socket is
pinned to its own session: the path's `/s/<id>` prefix is replaced by the socket's, and
the proxy's management routes (`/legorl/...`: list and close sessions) are refused. An
agent therefore cannot read, write or close another rollout's session. The socket itself is
the sandbox's credential: the proxy's per-run token (`legorl/http_auth.py`) is asked only of
requests on its TCP port, never of a pinned one, so no secret enters a sandbox.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import orjson

from legorl.asgi_serve import KEEP_ALIVE_S, LoopServer, guarded_httptools

Scope = dict[str, Any]
PINNED = "legorl.pinned"  # scope key: the request came in on a session socket (pinned, needs no token)


class SessionPinned:
    """ASGI wrapper: every HTTP request goes to `/s/<session_id>/...` of the inner app."""

    def __init__(self, app: Any, session_id: str) -> None:
        self.app = app
        self.prefix = f"/s/{session_id}"

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":  # not served: refused at the handshake, quietly
            msg = await receive()
            if msg["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008, "reason": "not served"})
            return
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path: str = scope["path"]
        if path.startswith("/s/"):
            rest = path[3:]
            cut = rest.find("/")
            path = rest[cut:] if cut >= 0 else "/"
        if path.startswith("/legorl"):
            body = orjson.dumps(
                {"error": {"message": "management routes are not reachable from a sandbox", "type": "permission_error"}}
            )
            await send(
                {"type": "http.response.start", "status": 403, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": body})
            return
        # pinned: a scope key no client can set (the server builds the scope), read by the proxy
        # app as "this session's own socket": the per-run token is not asked of a sandbox
        scope = dict(scope, path=self.prefix + path, raw_path=(self.prefix + path).encode(), **{PINNED: True})
        await self.app(scope, receive, send)


class SessionSocket:
    """Serve one session of a running `ProxyServer` on a unix socket (same event loop)."""

    def __init__(self, asgi_app: Any, session_id: str, path: str | Path) -> None:
        self.app = SessionPinned(asgi_app, session_id)
        self.path = str(path)
        self._server: LoopServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        os.chmod(self.path, 0o666)  # the sandbox's user may be unprivileged
        sock.listen(256)
        sock.setblocking(False)
        cfg = getattr(getattr(self.app.app, "ctx", None), "cfg", None)  # the proxy's: its header timeout
        guarded = guarded_httptools(cfg.header_timeout_s) if cfg is not None else None
        extra = {"http": guarded} if guarded is not None else {}
        self._server = LoopServer(
            self.app, sock, what=f"session socket {self.path}", timeout_keep_alive=KEEP_ALIVE_S, **extra
        )
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(timeout_s=10)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def __aenter__(self) -> SessionSocket:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
