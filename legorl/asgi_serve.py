"""Serve an ASGI app with uvicorn on ready-made sockets, inside the caller's event loop.

The proxy, its per-session unix sockets and the engine server all run in the process
that owns the engine and the trainer, on that process's event loop (no threads, no
extra processes): uvicorn's `_serve` is used where it exists because `serve` would take
over the process's signal handlers. Start-up waits until uvicorn is accepting, and a
server that dies during start-up raises instead of leaving the caller waiting.

Front ends that face clients (the proxy) are served with `guarded_httptools`: a request's
line and headers must arrive within a timeout of the connection opening (or of the
request's first byte), else the connection is closed with a JSON 408 (slowloris), and
what the HTTP parser rejects gets a JSON 400 in OpenAI's error shape instead of uvicorn's
plain text, logged at debug level only (a sandbox's garbage is no news for the console).
(Body timeouts are the application's: see `proxy/app.py`.)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import socket
from typing import Any

import orjson
import uvicorn

log = logging.getLogger(__name__)


KEEP_ALIVE_S = 75
"""How long a served connection may idle between requests. Longer than any client keeps one
(Node's undici 4 s, httpx 5 s, nginx's upstream default 60 s), so the client, never the
server, ends an idle connection: a server that closes one just as the client reuses it
resets the client's next request. uvicorn's own default is 5 s."""


def http_impl() -> str:
    """httptools when installed (several times cheaper per request than h11)."""
    return "httptools" if importlib.util.find_spec("httptools") else "h11"


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket (port 0: a free one); a clear error when taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(
            e.errno, f"cannot listen on {host}:{port}: {e.strerror} (is another server running? use another --port)"
        ) from e
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class LoopServer:
    """`await start()` / `await stop()` a uvicorn server for `app` on `sock`."""

    def __init__(self, app: Any, sock: socket.socket, *, what: str, **config: Any) -> None:
        options: dict[str, Any] = dict(
            lifespan="off",
            log_level="warning",
            access_log=False,
            loop="none",
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=5,
        )
        options.update(config)
        self.sock = sock
        self.what = what
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        serve = getattr(self.server, "_serve", None) or self.server.serve  # _serve: no signal capture
        self.task = asyncio.get_running_loop().create_task(serve(sockets=[self.sock]))
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError(f"the {self.what} stopped during start-up")
            await asyncio.sleep(0.002)

    async def stop(self, timeout_s: float | None = None) -> None:
        if self.task is not None:
            self.server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, timeout_s)
            self.task = None
        self.sock.close()


def _error_response(status: bytes, message: str, code: str) -> bytes:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}})
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n"
        + body
    )


def guarded_httptools(header_timeout_s: float) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol with a header timeout and JSON errors (None without
    httptools: h11 then serves, unguarded)."""
    if http_impl() != "httptools":
        return None
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpTools(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.write(
                    _error_response(
                        b"408 Request Timeout",
                        f"the request line and headers did not arrive within "
                        f"{header_timeout_s:g} s (proxy setting `header_timeout_s`)",
                        "header_timeout",
                    )
                )
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            """uvicorn's, but a request the parser rejects is the client's mistake: answered
            with a JSON 400, logged at debug level, never a warning on the trainer's console
            (a sandboxed agent can send any bytes it likes)."""
            import httptools

            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as e:
                log.debug("malformed HTTP request: %s", e)
                self.send_400_response(str(e) or "Invalid HTTP request received.")
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()

        def _unsupported_upgrade_warning(self) -> None:
            log.debug("unsupported upgrade request (served as plain HTTP)")

        def send_400_response(self, msg: str) -> None:
            self.transport.write(
                _error_response(b"400 Bad Request", f"malformed HTTP request: {msg}", "bad_http_request")
            )
            self.transport.close()

    return GuardedHttpTools


def tcp_server(app: Any, host: str, port: int, *, what: str, header_timeout_s: float | None = None) -> LoopServer:
    """A LoopServer for `app` on a freshly bound `host:port` (port 0: a free one; read it
    from `.sock`), with the HTTP options of our TCP front ends (proxy, engine server):
    httptools when installed, `KEEP_ALIVE_S` keep-alive, a 2048-connection backlog. Not started
    yet: `await start()`. With `header_timeout_s`, served by `guarded_httptools`."""
    sock = bind_tcp(host, port)
    http: Any = http_impl()
    if header_timeout_s is not None:
        http = guarded_httptools(header_timeout_s) or http
    return LoopServer(app, sock, what=what, http=http, timeout_keep_alive=KEEP_ALIVE_S, backlog=2048)
