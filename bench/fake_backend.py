"""An OpenAI-compatible upstream that answers at once, so a benchmark through a proxy
measures the proxy and not generation.

`POST /v1/chat/completions` (also `/chat/completions`) replies with the same 10-token
completion every time, `"I will read the file and fix the failing test."` (the reply the
proxy's scripted engine replays in `bench/proxy_vs_litellm.sh`, so both proxies send back
the same text). With `"stream": true` it answers as an engine does: one SSE event per
token, each in its own write (a proxy under test then pays for every event, not one
coalesced blob), a final event with `finish_reason`, a usage event when
`stream_options.include_usage` is set, then `data: [DONE]`. `usage.prompt_tokens` is the
request's size in bytes / 4 unless `--prompt-tokens` fixes it. `GET /health` returns
counters (requests, streams, rejected bodies); `GET /v1/models` lists one model.

    python bench/fake_backend.py --port 9100

It binds loopback addresses only. Needs aiohttp; orjson and uvloop are used when present.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from aiohttp import web

try:
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    def _loads(raw: bytes) -> Any:
        return orjson.loads(raw)

except ImportError:  # pragma: no cover - orjson is optional

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def _loads(raw: bytes) -> Any:
        return json.loads(raw)


# One piece per token; joined they are the reply the scripted engine replays.
REPLY_TOKENS = ("I", " will", " read", " the", " file", " and", " fix", " the", " failing", " test.")
REPLY = "".join(REPLY_TOKENS)
STARTED = int(time.time())


def usage(prompt_tokens: int) -> dict[str, int]:
    done = len(REPLY_TOKENS)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}


def completion_json(model: str, prompt_tokens: int) -> bytes:
    """The non-streaming answer: one choice holding the whole reply."""
    return _dumps(
        {
            "id": "chatcmpl-fakebackend",
            "object": "chat.completion",
            "created": STARTED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": REPLY},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": usage(prompt_tokens),
        }
    )


def completion_events(model: str, prompt_tokens: int, with_usage: bool) -> list[bytes]:
    """The streaming answer, one SSE event per element: role, the tokens, finish, usage, DONE."""

    def event(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
        chunk = {
            "id": "chatcmpl-fakebackend",
            "object": "chat.completion.chunk",
            "created": STARTED,
            "model": model,
            "choices": choices,
            **(extra or {}),
        }
        return b"data: " + _dumps(chunk) + b"\n\n"

    def delta(d: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]

    events = [event(delta({"role": "assistant", "content": ""}))]
    events += [event(delta({"content": piece})) for piece in REPLY_TOKENS]
    events.append(event(delta({}, finish="stop")))
    if with_usage:
        events.append(event([], {"usage": usage(prompt_tokens)}))
    events.append(b"data: [DONE]\n\n")
    return events


def make_app(prompt_tokens: int | None = None) -> web.Application:
    """The aiohttp application; `prompt_tokens` fixes usage.prompt_tokens (default: bytes / 4)."""
    counters = {"requests": 0, "streams": 0, "rejected": 0}

    def bad(message: str) -> web.Response:
        counters["rejected"] += 1
        return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=400)

    async def chat(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = _loads(raw)
        except ValueError as e:
            return bad(f"request body is not JSON: {e}")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return bad("request body must be a JSON object with a 'messages' list")
        model = str(body.get("model") or "fake-model")
        ptoks = prompt_tokens if prompt_tokens is not None else len(raw) // 4
        counters["requests"] += 1
        if not body.get("stream"):
            return web.Response(body=completion_json(model, ptoks), content_type="application/json")
        counters["streams"] += 1
        opts = body.get("stream_options")
        with_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for ev in completion_events(model, ptoks, with_usage):
            await resp.write(ev)  # one write per event, as an engine streams
        await resp.write_eof()
        return resp

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True, **counters})

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/chat/completions", chat)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=9100)
    ap.add_argument("--prompt-tokens", type=int, default=None, help="usage.prompt_tokens (default: bytes / 4)")
    a = ap.parse_args(argv)
    if not is_loopback(a.host):
        sys.exit(f"fake_backend: refusing to bind {a.host!r}: loopback addresses only")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(make_app(a.prompt_tokens), host=a.host, port=a.port, access_log=None, print=None, backlog=4096)


if __name__ == "__main__":
    main()
