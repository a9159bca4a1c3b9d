"""The proxy as a raw ASGI application: routing, body limits, streaming, error handling.

Why raw ASGI and not FastAPI: the proxy's budget is a fifth of LiteLLM's CPU per request
(≈1–6 ms) while it also renders a ~7k-token prompt, and a validating framework spends
that budget on a 30 KB body alone. So bodies are parsed once with orjson, routes are one
dict lookup, and SSE chunks are pre-framed bytes written straight to the ASGI `send`.

Routes (each also under `/s/{session_id}`; `/v1` may be left out):
  POST /v1/chat/completions   OpenAI Chat Completions      (openai_chat.py)
  POST /v1/messages           Anthropic Messages           (anthropic.py)
  POST /v1/messages/count_tokens   true prompt token count
  POST /v1/responses          OpenAI Responses             (responses.py)
  POST /v1beta/models/{model}:generateContent | :streamGenerateContent | :countTokens
                              Google Gemini API            (gemini.py)
  GET  /v1/models             the served model (both dialects' fields)
  GET  /health, HEAD|GET /    liveness
  GET  /legorl/sessions       open sessions
  DELETE /legorl/sessions/{id}  close a session, write its trajectory
Query strings (Claude Code's `?beta=true`) are ignored, except Gemini's `?key=` (a session id).

Bad input: every client mistake is a 4xx in the dialect's error shape. Bodies are held to
the parse-time limits of `limits.py` before anything is generated (so every accepted turn
can be recorded), must arrive within `body_timeout_s` (408, connection closed), and bodies
over `offload_bytes` are parsed and tokenised on a worker thread (`render_cache.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import ModuleType
from typing import Any, Awaitable, Callable

import orjson

from legorl.http_auth import HostCheck, same
from legorl.proxy import anthropic, blame, gemini, openai_chat, responses
from legorl.proxy.context import ProxyContext
from legorl.proxy.errors import CONTEXT_EXCEEDED, ProxyError, context_too_long, error_body, stream_error_event
from legorl.proxy.limits import check_body, limit_error
from legorl.proxy.pipeline import Parsed, TurnRun
from legorl.proxy.render_cache import Journal, TooLong
from legorl.proxy.renderer import Renderer
from legorl.proxy.session_socket import PINNED
from legorl.proxy.sessions import Session
from legorl.types import Dialect

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

DIALECTS: dict[str, ModuleType] = {
    "/v1/chat/completions": openai_chat,
    "/chat/completions": openai_chat,
    "/v1/messages": anthropic,
    "/messages": anthropic,
    "/v1/responses": responses,
    "/responses": responses,
}
_JSON = [(b"content-type", b"application/json")]
_OPEN_PATHS = frozenset({"/health", "/", "/v1/models", "/models"})  # liveness and the model name: no token
_ERROR_SEND_S = 10.0  # how long a failed call waits for its client to take the error answer
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


def _dialect_of_path(path: str) -> Dialect | None:
    if "/messages" in path:
        return Dialect.ANTHROPIC
    return Dialect.GEMINI if gemini.is_gemini_path(path) else None


async def send_json(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*_JSON, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, dialect: Dialect | None, err: ProxyError) -> None:
    body = error_body(dialect, err)
    headers = [*_JSON, (b"content-length", str(len(body)).encode())]
    if err.close:
        headers.append((b"connection", b"close"))
    if err.status == 429:  # OpenAI and Anthropic clients wait this long before their retry
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ClientGone(Exception):
    """The client disconnected while its request was being read."""


class ProxyApp:
    """ASGI callable; see the module docstring for the routes."""

    def __init__(
        self,
        ctx: ProxyContext,
        on_shutdown: Callable[[], None] | None = None,
        *,
        secret: str | None = None,
        hosts: HostCheck | None = None,
    ) -> None:
        self.ctx = ctx
        self.on_shutdown = on_shutdown
        self.started_at = time.time()
        self.secret = secret  # every TCP request but liveness must carry it (None: open)
        self.hosts = hosts  # the Host values a TCP request may name (None: not checked)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":  # not served: refused at the handshake, without a log line
            await _refuse_websocket(receive, send)
            return
        if kind == "http":
            try:
                await self._http(scope, receive, send)
            except ClientGone:
                return
            return
        if kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self.on_shutdown is not None:
                    try:
                        self.on_shutdown()
                    except Exception:  # noqa: BLE001 - shutdown must finish
                        log.exception("proxy shutdown hook failed")
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- routing ------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        sid: str | None = None
        from_url = False
        if path.startswith("/s/"):
            sid, _, rest = path[3:].partition("/")
            path, from_url = "/" + rest, True
        mod = DIALECTS.get(path)
        gemini_route = gemini.match(path) if mod is None else None
        pinned = bool(scope.get(PINNED))  # a session socket's request: pinned to its session, no token
        try:
            if _is_upgrade(headers):  # a WebSocket upgrade: not served, answered quietly
                raise ProxyError(400, "WebSocket upgrades are not served: use plain HTTP", "invalid_request")
            if not pinned and self.hosts is not None and not self.hosts.ok(headers):
                raise ProxyError(403, self.hosts.refusal(headers), "permission")
            authorized, key = self._credentials(scope, pinned, gemini_route is not None)
            if not from_url:
                sid = key
            if not authorized and path not in _OPEN_PATHS:
                raise ProxyError(
                    401,
                    "this proxy requires its token: send it as the API key (Authorization: Bearer <token> or "
                    "x-api-key), with the session in the URL (/s/<session>/v1/...) or after the token "
                    "(<token>:<session>)",
                    "authentication",
                )
            if mod is not None:
                if method != "POST":
                    raise ProxyError(405, f"{method} {path}: use POST", "invalid_request")
                await self._model_call(scope, receive, send, mod, sid, from_url)
            elif gemini_route is not None:
                await self._gemini(scope, receive, send, gemini_route, method, sid, from_url)
            elif path in ("/v1/messages/count_tokens", "/messages/count_tokens") and method == "POST":
                await self._count_tokens(scope, receive, send, sid, from_url)
            elif path in ("/v1/models", "/models") and method == "GET":
                await send_json(send, 200, self._models())
            elif path in ("/health", "/") and method in ("GET", "HEAD"):
                status: dict[str, Any] = {"status": "ok"}
                if authorized:
                    status["sessions"] = len(self.ctx.sessions.open_sessions)
                await send_json(send, 200, orjson.dumps(status))
            elif path.startswith("/legorl/sessions"):
                await self._admin(method, path, send)
            else:
                raise ProxyError(404, f"no route for {method} {scope['path']}", "not_found")
        except ProxyError as e:
            await send_error(send, _dialect_of_path(path), e)
        except ClientGone:
            raise
        except RecursionError:  # a safety net: the depth limit should have refused it already
            await send_error(send, _dialect_of_path(path), limit_error("max_json_depth", "request nests too deeply"))
        except Exception as e:  # noqa: BLE001 - a bug answers 500 and the server keeps serving
            log.exception("internal error on %s %s", method, scope["path"])
            await send_error(
                send, _dialect_of_path(path), ProxyError(500, f"internal error: {type(e).__name__}: {e}", "internal")
            )

    def _credentials(self, scope: Scope, pinned: bool, is_gemini: bool) -> tuple[bool, str | None]:
        """Whether the request may use this proxy, and the session its API key names: on an
        open proxy (or a session socket) the key is the session id; with a secret it is
        `<secret>` or `<secret>:<session>`, compared in constant time."""
        headers = scope["headers"]
        key = (gemini.key_of(scope.get("query_string", b""), headers) if is_gemini else None) or _key(headers)
        if pinned or self.secret is None:
            return True, key
        return _token_and_session(key, self.secret)

    def _models(self) -> bytes:
        name = self.ctx.cfg.served_model
        created = int(self.started_at)
        entry = {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "legorl",
            "type": "model",
            "display_name": name,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
        }
        return orjson.dumps({"object": "list", "data": [entry], "has_more": False, "first_id": name, "last_id": name})

    async def _admin(self, method: str, path: str, send: Send) -> None:
        reg = self.ctx.sessions
        if path == "/legorl/sessions" and method == "GET":
            await send_json(send, 200, orjson.dumps({"sessions": [s.summary() for s in reg.open_sessions.values()]}))
            return
        sid = path[len("/legorl/sessions/") :]
        if not sid or not path.startswith("/legorl/sessions/") or method != "DELETE":
            raise ProxyError(
                404, f"no route for {method} {path} (DELETE /legorl/sessions/<id> closes one)", "not_found"
            )
        try:
            s = reg.close(sid)
        except KeyError as e:
            raise ProxyError(404, str(e.args[0]), "not_found") from None
        s.closed_externally = True  # its owner (a rollout) ends it as ours, never the run
        await send_json(send, 200, orjson.dumps({**s.summary(), "late_turns": s.late_turns}))

    # -- request bodies -------------------------------------------------------------------
    async def _read_json(self, scope: Scope, receive: Receive) -> tuple[dict[str, Any], int]:
        """The body as a JSON object within the parse-time limits, and its size in bytes."""
        cfg = self.ctx.cfg
        # A bare timer, not asyncio.timeout(): this runs for every request (~half the cost).
        task = asyncio.current_task()
        fired: list[bool] = []
        timer = asyncio.get_running_loop().call_later(cfg.body_timeout_s, lambda: (fired.append(True), task.cancel()))
        try:
            raw = await self._read_raw(scope, receive)
        except asyncio.CancelledError:
            if not fired:
                raise
            task.uncancel()
            raise ProxyError(
                408,
                f"the request body did not arrive within {cfg.body_timeout_s:g} s (proxy setting `body_timeout_s`)",
                close=True,
            ) from None
        finally:
            timer.cancel()
        if not raw:
            raise ProxyError(400, "request body is empty: expected a JSON object")
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            if "depth limit" in str(e):
                raise limit_error(
                    "max_json_depth", f"request body nests arrays/objects more than {cfg.max_json_depth} levels deep"
                ) from None
            raise ProxyError(400, f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ProxyError(400, f"request body must be a JSON object, got {type(body).__name__}")
        check_body(raw, body, cfg.max_json_depth, cfg.max_string_chars, cfg.max_messages)
        return body, len(raw)

    async def _read_raw(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.ctx.cfg.max_body_bytes
        for k, v in scope["headers"]:
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    raise ProxyError(400, f"bad Content-Length header {v!r}") from None
                if n > limit:
                    raise ProxyError(
                        413,
                        f"request body of {n} bytes exceeds the limit of {limit} bytes "
                        "(proxy setting `max_body_bytes`)",
                        "too_large",
                    )
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ClientGone()
            chunk = msg.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise ProxyError(
                        413,
                        f"request body exceeds the limit of {limit} bytes (proxy setting `max_body_bytes`)",
                        "too_large",
                    )
                chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _gemini(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: tuple[str, str],
        method: str,
        sid: str | None,
        from_url: bool,
    ) -> None:
        """A Gemini API path: the model and the call (generate, stream, count) are in it."""
        model, call = route
        if call not in gemini.METHODS:
            raise ProxyError(404, f"no Gemini method {call!r}; served: {', '.join(gemini.METHODS)}", "not_found")
        if method != "POST":
            raise ProxyError(405, f"{method} {scope['path']}: use POST", "invalid_request")
        if call == "countTokens":
            await self._count_tokens(scope, receive, send, sid, from_url, Dialect.GEMINI)
        else:
            await self._model_call(
                scope, receive, send, gemini.Call(model, call == "streamGenerateContent"), sid, from_url
            )

    async def _count_tokens(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        sid: str | None,
        from_url: bool,
        dialect: Dialect = Dialect.ANTHROPIC,
    ) -> None:
        ctx = self.ctx
        mod = gemini if dialect is Dialect.GEMINI else anthropic
        to_chat = gemini.count_request if dialect is Dialect.GEMINI else anthropic.to_chat
        try:
            body, size = await self._read_json(scope, receive)
            session = ctx.sessions.resolve(sid, from_url)  # standalone: never opens one
            if size > ctx.cfg.offload_bytes:
                n, _ = await ctx.offload.run(lambda r: len(r.render(to_chat(body), session.state)))
            else:
                n = len(ctx.renderer.render(to_chat(body), session.state))
        except ProxyError as e:
            await send_error(send, dialect, e)
            return
        await send_json(send, 200, mod.count_tokens_body(n))

    # -- model calls ----------------------------------------------------------------------
    async def _model_call(
        self, scope: Scope, receive: Receive, send: Send, mod: ModuleType | gemini.Call, sid: str | None, from_url: bool
    ) -> None:
        dialect: Dialect = mod.DIALECT
        ctx = self.ctx
        size = 0
        session: Session | None = None
        try:
            body, size = await self._read_json(scope, receive)
            session = ctx.sessions.resolve(sid, from_url)
            session.requests += 1
            if size > ctx.cfg.offload_bytes:  # parse and tokenise on a thread; cache only if accepted

                def work(r: Renderer) -> tuple[Parsed, list[int]]:
                    p = mod.parse(body)
                    return p, r.render(p.chat, session.state)

                try:
                    (parsed, ids), commit = await ctx.offload.run(work, token_budget=ctx.max_context)
                except TooLong as e:  # one piece alone is over the window: refused, its ids never built
                    raise context_too_long(dialect, e.n_tokens, ctx.max_context) from None
                run = TurnRun(ctx, session, dialect, body, parsed)
                run.prepare(ids)
                commit()
            else:
                parsed = mod.parse(body)
                run = TurnRun(ctx, session, dialect, body, parsed)
                journal = Journal(ctx.renderer)
                try:
                    run.prepare()
                except BaseException:
                    journal.rollback()  # a refused prompt leaves nothing in the cache
                    raise
                journal.end()
            run.session = ctx.sessions.adopt(session)  # a standalone session opens here, once accepted
        except ProxyError as e:
            if e.code == CONTEXT_EXCEEDED and session is not None:
                session.context_errors += 1
            await send_error(send, dialect, e)
            return
        finally:
            if size > ctx.cfg.offload_bytes:
                # its transient memory back to the OS (render_cache.py), once this frame is gone
                asyncio.get_running_loop().call_soon(ctx.offload.trim)

        try:
            ticket = blame.admit(run.session, ctx.cfg.session_max_concurrency)
        except ProxyError as e:  # over the session's concurrency limit: the agent's, a 429
            await send_error(send, dialect, e)
            return
        try:
            await self._generate(run, parsed, mod, dialect, receive, send, ticket)
        finally:
            ticket.release()

    async def _generate(
        self,
        run: TurnRun,
        parsed: Parsed,
        mod: ModuleType | gemini.Call,
        dialect: Dialect,
        receive: Receive,
        send: Send,
        ticket: blame.Ticket,
    ) -> None:
        """Run one admitted call to its end and answer it (a JSON body or a stream)."""
        ctx = self.ctx
        task = asyncio.current_task()
        assert task is not None
        state = {"gone": False, "done": False, "sending": False}

        async def watch() -> None:  # a client that goes away aborts the generation
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    if not state["done"]:
                        state["gone"] = True
                        task.cancel()
                    return

        async def out(message: dict[str, Any]) -> None:  # a write the client may be slow to take
            state["sending"] = True
            await send(message)
            state["sending"] = False

        watcher = asyncio.get_running_loop().create_task(watch())
        started = False
        try:
            async with asyncio.timeout(ctx.cfg.request_timeout_s):
                await run.start()
                if not parsed.stream:
                    await run.run_to_end()
                    payload = mod.response(run)
                    run.record(delivered=True)
                    state["done"] = state["sending"] = True
                    await send_json(send, 200, payload)
                    return
                stream = mod.Stream(run)
                await send({"type": "http.response.start", "status": 200, "headers": _SSE})
                started = True
                await out({"type": "http.response.body", "body": stream.head(), "more_body": True})
                async for evs in run.events():
                    chunk = stream.events(evs)
                    if chunk:
                        await out({"type": "http.response.body", "body": chunk, "more_body": True})
                tail = stream.tail()
                run.record(delivered=True)  # before the client sees the end: its next call may splice it
                state["done"] = True
                await out({"type": "http.response.body", "body": tail, "more_body": False})
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            task.uncancel()
            await self._abort(run)
        except TimeoutError:
            err = ProxyError(504, f"the engine did not finish within {ctx.cfg.request_timeout_s:g} s", "timeout")
            await self._fail(run, send, dialect, err, started, ticket, bool(state["sending"]))
        except ProxyError as e:
            await self._fail(run, send, dialect, e, started, ticket, bool(state["sending"]))
        except Exception as e:  # noqa: BLE001 - a bug: keep the turn, end the stream with an error event
            log.exception("internal error in session %s", run.session.id)
            err = ProxyError(500, f"internal error: {type(e).__name__}: {e}", "internal")
            await self._fail(run, send, dialect, err, started, ticket, False)
        finally:
            state["done"] = True
            watcher.cancel()

    async def _abort(self, run: TurnRun) -> None:
        """Stop the engine; keep what it had sampled as an aborted turn (never trained on)."""
        await run.aclose()
        if run.completion_ids and not run.recorded:
            run.record(delivered=False)

    async def _fail(
        self,
        run: TurnRun,
        send: Send,
        dialect: Dialect,
        err: ProxyError,
        started: bool,
        ticket: blame.Ticket | None = None,
        sending: bool = False,
    ) -> None:
        """Answer a failed call, counted as ours or as the agent's (`blame.py`): only a fault
        that is provably ours is logged as a warning; the agent's own stay at debug level."""
        cause = blame.charge(run.session, err, ticket, sending, run.last_step_at, self.ctx.cfg.request_timeout_s)
        if cause is None and err.status >= 500:
            log.warning("session %s: %s", run.session.id, err.message)
        else:
            log.debug("session %s (%s): %s", run.session.id, cause or err.status, err.message)
        if err.code == CONTEXT_EXCEEDED:  # the engine's own window, smaller than the proxy's
            run.session.context_errors += 1
        await self._abort(run)
        try:  # a client that is not reading must not hold this call open forever
            async with asyncio.timeout(_ERROR_SEND_S):
                if started:
                    await send(
                        {"type": "http.response.body", "body": stream_error_event(dialect, err), "more_body": False}
                    )
                else:
                    await send_error(send, dialect, err)
        except TimeoutError:
            log.debug("session %s: the client did not take the error answer", run.session.id)


def _token_and_session(key: str | None, secret: str) -> tuple[bool, str | None]:
    """Whether `key` carries the proxy's token, and the session it names after it, if any:
    the key is `<token>` (the session is in the URL) or `<token>:<session>`."""
    if key is None:
        return False, None
    token, sep, session = key.partition(":")
    if not same(token, secret):
        return False, None
    return True, (session or None) if sep else None


def _is_upgrade(headers: list[tuple[bytes, bytes]]) -> bool:
    """A WebSocket upgrade (other upgrades, such as curl's `h2c`, are ignored as HTTP/1.1 allows)."""
    return any(k == b"upgrade" and v.strip().lower() == b"websocket" for k, v in headers)


async def _refuse_websocket(receive: Receive, send: Send) -> None:
    msg = await receive()
    if msg["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008, "reason": "not served"})


def _key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The session id a harness sends as its API key."""
    bearer = None
    for k, v in headers:
        if k == b"x-api-key":
            return v.decode("latin-1").strip() or None
        if k == b"authorization":
            val = v.decode("latin-1").strip()
            bearer = val[7:].strip() if val[:7].lower() == "bearer " else val
    return bearer or None
