"""`legorl engine-serve`: any Engine behind the vLLM completions API our `vllm` client speaks.

Why: remote rollout workers (Ray actors on other processes or machines) need the policy,
but the policy may live in the trainer's process (the `hf` engine, whose weights the
trainer updates in place). Serving that engine object over the same token-in/token-out
protocol a real vLLM server speaks means remote workers use the `vllm` engine kind — the
code path users take against a GPU vLLM server — and weight sync stays in-process.

Routes (formats in `serve_protocol.py`):
  POST /v1/completions        token-id prompt → ids, logprobs (SSE with `stream: true`)
  GET  /v1/models             the served model
  GET  /health                200 when serving
  POST /collective_rpc        `{"method": "reload_weights"}`: re-read the served model
                              directory into the engine (vLLM's dev-mode RL route)
  POST /reset_prefix_cache    accepted (an engine without a prefix cache has nothing to drop)
  POST /update_weight_version `{"new_version": "N"}` → the engine's `policy_version`
  GET  /get_weight_version    the engine's `policy_version`

Authentication (`legorl/http_auth.py`): with `api_key`, every route but `/health` needs
`Authorization: Bearer <key>` (compared in constant time); on loopback the `Host` header must
name the bound address (DNS rebinding). `legorl engine-serve` requires a key unless started
with `--insecure` on loopback, and refuses a non-loopback bind without `--api-key`. The admin
routes validate what they are given: a weight version is an integer in [0, 2^31).

The server shares the caller's event loop (an in-process engine must be driven from the
loop it was created on) and binds its socket before returning, so `port=0` is race-free:

    async with EngineServer(engine, tokenizer, "tiny-qwen3") as srv:
        client = VLLMEngine(srv.url, "tiny-qwen3")
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from legorl.asgi_serve import LoopServer, tcp_server
from legorl.engine.base import ContextLengthExceeded, Engine, EngineError, WeightsFromDisk
from legorl.engine.serve_protocol import Completion, Detokenizer, HTTPError, context_message, error_body, parse_request
from legorl.http_auth import HostCheck, header, is_loopback, policy, same
from legorl.types import FinishReason, TokenStep


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class EngineApp:
    """The ASGI application: one engine, one served model name."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        served_model: str,
        *,
        model_dir: str | Path | None = None,
        api_key: str | None = None,
    ) -> None:
        self.engine, self.tokenizer, self.served_model = engine, tokenizer, served_model
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.api_key = api_key
        self.hosts: HostCheck | None = None  # set by EngineServer once bound (None: not checked)
        self.max_context = int(engine.max_context or 2**31)
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/collective_rpc", self.collective_rpc, methods=["POST"]),
                Route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"]),
                Route("/update_weight_version", self.update_weight_version, methods=["POST"]),
                Route("/get_weight_version", self.get_weight_version, methods=["GET"]),
            ]
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":  # not served: refused at the handshake, quietly
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] == "http":
            headers = scope["headers"]
            if self.hosts is not None and not self.hosts.ok(headers):
                await _json(error_body(self.hosts.refusal(headers), "PermissionError", 403), 403)(scope, receive, send)
                return
            if self.api_key and scope["path"] != "/health":
                auth = header(headers, b"authorization") or ""
                given = auth[7:].strip() if auth[:7].lower() == "bearer " else None
                if not same(given, self.api_key):
                    body = error_body(
                        "this engine server requires its key: Authorization: Bearer <key>", "Unauthorized", 401
                    )
                    await _json(body, 401)(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    # ---- generation ---------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as e:
            return _json(error_body(f"the request body is not valid JSON: {e}", "BadRequestError", 400), 400)
        try:
            req, prompt_ids, params = parse_request(body, self.served_model, self.max_context)
        except HTTPError as e:
            return _json(e.body(), e.status)
        comp = Completion(req, prompt_ids, Detokenizer(self.tokenizer, req.skip_special_tokens), self.served_model)
        steps = self.engine.stream(prompt_ids, params)
        try:
            first = await anext(steps)  # argument errors surface here, before any byte is sent
        except ContextLengthExceeded:
            await steps.aclose()
            return _json(
                error_body(
                    context_message(self.max_context, len(prompt_ids), req.max_tokens), "BadRequestError", 400, "prompt"
                ),
                400,
            )
        except ValueError as e:
            await steps.aclose()
            return _json(error_body(str(e), "BadRequestError", 400), 400)
        except Exception as e:
            await steps.aclose()
            return _json(error_body(f"{type(e).__name__}: {e}", "InternalServerError", 500), 500)
        if req.stream:
            return StreamingResponse(
                self._events(comp, first, steps), media_type="text/event-stream", headers={"cache-control": "no-cache"}
            )
        try:
            finish, routing = await self._collect(comp, first, steps)
        except Exception as e:
            return _json(error_body(f"{type(e).__name__}: {e}", "InternalServerError", 500), 500)
        finally:
            await steps.aclose()
        return _json(comp.response(finish, routing))

    async def _collect(
        self, comp: Completion, step: TokenStep, steps: AsyncIterator[TokenStep]
    ) -> tuple[FinishReason, list[list[list[int]]] | None]:
        while True:
            if step.token_id is not None:
                comp.add(step.token_id, step.logprob or 0.0)
            if step.finish_reason is not None:
                return step.finish_reason, step.routed_experts
            step = await anext(steps)

    async def _events(self, comp: Completion, step: TokenStep, steps: AsyncIterator[TokenStep]) -> AsyncIterator[bytes]:
        """One chunk per token; the last token is held back one step so that it carries the
        finish reason, as vLLM's last chunk does. A failure mid-stream is an `error` event."""
        held: TokenStep | None = None
        sent = 0
        try:
            while True:
                if step.token_id is not None:
                    if held is not None:
                        comp.add(held.token_id or 0, held.logprob or 0.0)
                        yield _sse(comp.chunk(sent, None))
                        sent = len(comp.ids)
                    held = step
                if step.finish_reason is not None:
                    if held is not None:
                        comp.add(held.token_id or 0, held.logprob or 0.0)
                    yield _sse(comp.chunk(sent, step.finish_reason))
                    break
                try:
                    step = await anext(steps)
                except StopAsyncIteration:
                    raise EngineError("the engine's stream ended without a finish reason") from None
            if comp.req.stream_options is not None and comp.req.stream_options.include_usage:
                yield _sse(comp.usage_chunk())
        except Exception as e:  # the client learns why the stream stopped
            yield _sse(error_body(f"{type(e).__name__}: {e}", "InternalServerError", 500))
        finally:
            await steps.aclose()
        yield b"data: [DONE]\n\n"

    # ---- model, health, weights ---------------------------------------------------------

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.served_model,
            "object": "model",
            "created": 0,
            "owned_by": "legorl",
            "root": str(self.model_dir or self.served_model),
            "parent": None,
            "max_model_len": self.max_context,
            "permission": [],
        }
        return _json({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def collective_rpc(self, request: Request) -> Response:
        body = await _body(request)
        if body.get("method") != "reload_weights":
            return _json(
                error_body(
                    f"collective_rpc method {body.get('method')!r}: only 'reload_weights' is served",
                    "BadRequestError",
                    400,
                    "method",
                ),
                400,
            )
        update = self.engine.update_weights_from_disk if isinstance(self.engine, WeightsFromDisk) else None
        if self.model_dir is None or update is None:
            why = (
                "no model directory was given" if self.model_dir is None else f"{self.engine.name} cannot load weights"
            )
            return _json(error_body(f"reload_weights: {why}", "BadRequestError", 400), 400)
        try:
            await update(self.model_dir, self.engine.policy_version)
        except ValueError as e:
            return _json(error_body(f"reload_weights: {e}", "BadRequestError", 400), 400)
        return _json({"results": [None]})

    async def reset_prefix_cache(self, request: Request) -> Response:
        return Response(status_code=200)

    async def update_weight_version(self, request: Request) -> Response:
        body = await _body(request)
        version = weight_version(body.get("new_version"))
        if version is None:
            return _json(
                error_body(
                    f"new_version must be an integer in [0, {MAX_WEIGHT_VERSION}], got {body.get('new_version')!r:.80}",
                    "BadRequestError",
                    400,
                    "new_version",
                ),
                400,
            )
        self.engine.policy_version = version
        return _json({"success": True, "new_version": str(version)})

    async def get_weight_version(self, request: Request) -> Response:
        return _json({"weight_version": str(self.engine.policy_version)})


MAX_WEIGHT_VERSION = 2**31 - 1  # a step count: far beyond any run, far below what breaks a store or a UI


def weight_version(raw: object) -> int | None:
    """A weight version as vLLM's route takes it (an int or its decimal string), or None when
    it is not a sane one: negative, huge, fractional, a bool or anything else."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        v = raw
    elif isinstance(raw, str) and raw.strip().isdigit() and len(raw.strip()) <= 10:
        v = int(raw.strip())
    else:
        return None
    return v if 0 <= v <= MAX_WEIGHT_VERSION else None


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        body = None
    return body if isinstance(body, dict) else {}


class EngineServer:
    """An EngineApp on a TCP port, served from the caller's event loop."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        served_model: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_dir: str | Path | None = None,
        api_key: str | None = None,
    ) -> None:
        self.app = EngineApp(engine, tokenizer, served_model, model_dir=model_dir, api_key=api_key)
        self.host, self.port = host, port
        self._server: LoopServer | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        self._server = tcp_server(self.app, self.host, self.port, what="engine server")
        self.port = self._server.sock.getsockname()[1]
        self.app.hosts = HostCheck(self.host).bound(self.port)
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None

    async def __aenter__(self) -> EngineServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def serve_engine(engine_cfg: Any, host: str, port: int, *, api_key: str | None = None, insecure: bool = False) -> None:
    """`legorl engine-serve`: build the configured engine and serve it until SIGINT/SIGTERM.

    A key is required (`api_key`, else `$LEGORL_TOKEN`, else a fresh one, printed) unless
    `insecure` on loopback; off loopback the key must be given (`--api-key`): a printed one
    would reach the remote workers only by hand, and an open engine off loopback is refused.

    The served model name is `engine_cfg.served_model_name` or `engine_cfg.model`; clients
    configure `[engine] kind = "vllm"`, `url = <printed URL>`, the same `model` (for its
    tokenizer) and that name. Weight reloads re-read the model's directory."""
    from legorl.engine.registry import make_engine
    from legorl.models import load_tokenizer, resolve_model

    if not is_loopback(host) and not api_key:
        raise SystemExit(
            f"legorl engine-serve: binding {host!r} (off loopback) needs --api-key (or $LEGORL_ENGINE_API_KEY): "
            "an engine anyone on the network can drive and reload is refused"
        )
    key = policy("engine-serve", host, api_key, insecure)
    tokenizer = load_tokenizer(engine_cfg.model)
    model_dir = resolve_model(engine_cfg.model) if engine_cfg.kind == "hf" else None
    engine = make_engine(engine_cfg, tokenizer)
    name = engine_cfg.served_model_name or engine_cfg.model

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            async with EngineServer(
                engine, tokenizer, name, host=host, port=port, model_dir=model_dir, api_key=key
            ) as srv:
                print(
                    f"legorl engine-serve: {engine_cfg.kind}:{engine_cfg.model} as {name!r} at {srv.url} "
                    f"(vLLM-compatible /v1/completions)",
                    flush=True,
                )
                if key is None:
                    print("legorl engine-serve: --insecure: no key is asked (any local process can use it)", flush=True)
                elif key != api_key:
                    print(f"legorl engine-serve: key {key} (clients send Authorization: Bearer <key>)", flush=True)
                await stop.wait()
        finally:
            await engine.close()
            print("legorl engine-serve: stopped", flush=True)

    try:
        asyncio.run(main())
    except OSError as e:  # the port is taken, the host is not ours: one line, not a traceback
        raise SystemExit(f"legorl engine-serve: {e}") from None
