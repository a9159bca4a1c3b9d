"""Hypothesis strategies for request bodies of the four dialects, and a proxy on a
thread for sync clients (tests/proxy/test_proxy_bad_input.py, bench/proxy_soak.py).

Each body is a plausible request with parts replaced by arbitrary JSON: wrong types where
strings are expected (a `role` that is a list, `content` that is a number), unknown block
types, missing fields, deep or long values. Every one must be answered 2xx or 4xx.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

CHAT, MSGS, RESP = "/v1/chat/completions", "/v1/messages", "/v1/responses"
GEM = "/v1beta/models/m:generateContent"  # streaming is the URL's: GEM_STREAM
GEM_STREAM, GEM_COUNT = "/v1beta/models/m:streamGenerateContent?alt=sse", "/v1beta/models/m:countTokens"

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8
)


def either(valid: st.SearchStrategy[Any], p_valid: int = 10) -> st.SearchStrategy[Any]:
    """Mostly `valid`, sometimes arbitrary JSON."""
    return st.sampled_from([False] * p_valid + [True]).flatmap(lambda wild: json_values if wild else valid)


def _obj(
    fields: dict[str, st.SearchStrategy[Any]],
    required: dict[str, st.SearchStrategy[Any]] | None = None,
    wild: bool = True,
) -> st.SearchStrategy[Any]:
    """A dict with `required` and a random subset of `fields` (each mostly valid);
    `wild`: sometimes arbitrary JSON instead."""
    d = st.fixed_dictionaries(
        {k: either(v, 20) for k, v in (required or {}).items()}, optional={k: either(v) for k, v in fields.items()}
    )
    return either(d, 8) if wild else d


text = st.text(max_size=30)
parts = st.lists(
    _obj({"text": text}, {"type": st.sampled_from(["text", "image_url", "input_text", "refusal", "bogus"])}), max_size=3
)
call = _obj(
    {
        "id": text,
        "type": st.just("function"),
        "function": _obj({"name": st.sampled_from(["bash", "edit"]), "arguments": st.just('{"cmd": "ls"}') | text}),
    }
)
chat_msg = _obj(
    {"tool_calls": st.lists(call, max_size=2), "tool_call_id": text, "reasoning_content": text},
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]),
        "content": text | parts | st.none(),
    },
)
tool = _obj(
    {
        "type": st.just("function"),
        "function": _obj(
            {
                "name": st.sampled_from(["bash", "edit"]),
                "description": text,
                "parameters": st.just({"type": "object", "properties": {}}) | json_values,
            }
        ),
    }
)

block = _obj(
    {
        "text": text,
        "thinking": text,
        "id": text,
        "name": st.sampled_from(["bash", "edit"]),
        "input": st.just({"cmd": "ls"}) | json_values,
        "tool_use_id": text,
        "content": text | st.lists(_obj({"type": st.just("text"), "text": text}), max_size=2),
    },
    {"type": st.sampled_from(["text", "image", "thinking", "tool_use", "tool_result", "document", "x"])},
)
anth_msg = _obj(
    {}, {"role": st.sampled_from(["user", "assistant", "system"]), "content": text | st.lists(block, max_size=3)}
)
anth_tool = _obj(
    {
        "name": st.sampled_from(["bash", "edit"]),
        "description": text,
        "input_schema": st.just({"type": "object", "properties": {}}) | json_values,
    }
)

item = _obj(
    {
        "content": text | parts,
        "summary": st.lists(_obj({"type": st.just("summary_text"), "text": text}), max_size=2),
        "call_id": text,
        "name": st.sampled_from(["bash", "edit"]),
        "arguments": st.just("{}") | text,
        "output": text,
    },
    {
        "type": st.sampled_from(["message", "reasoning", "function_call", "function_call_output", "web"]),
        "role": st.sampled_from(["user", "assistant", "system", "developer"]),
    },
)
resp_tool = _obj(
    {
        "type": st.just("function"),
        "name": st.sampled_from(["bash", "edit"]),
        "description": text,
        "parameters": st.just({"type": "object", "properties": {}}) | json_values,
    }
)

gem_part = _obj(
    {
        "text": text,
        "thought": st.booleans(),
        "thoughtSignature": text,
        "functionCall": _obj(
            {"name": st.sampled_from(["bash", "edit"]), "id": text, "args": st.just({"cmd": "ls"}) | json_values}
        ),
        "functionResponse": _obj(
            {"name": st.sampled_from(["bash", "edit"]), "id": text, "response": st.just({"output": "ok"}) | json_values}
        ),
        "inlineData": _obj({"mimeType": st.just("image/png"), "data": text}),
        "bogus": json_values,
    }
)
gem_content = _obj(
    {"role": st.sampled_from(["user", "model", "function", "system"])}, {"parts": st.lists(gem_part, max_size=3)}
)
gem_decl = _obj(
    {
        "description": text,
        "parameters": st.just({"type": "OBJECT", "properties": {}}) | json_values,
        "parametersJsonSchema": st.just({"type": "object"}) | json_values,
    },
    {"name": st.sampled_from(["bash", "edit"])},
)
gem_tool = _obj({"functionDeclarations": st.lists(gem_decl, max_size=2), "googleSearch": st.just({})})
gem_config = _obj(
    {
        "temperature": st.floats(0, 2),
        "topP": st.floats(0.1, 1),
        "topK": st.integers(-1, 40),
        "maxOutputTokens": st.integers(-2, 40),
        "stopSequences": st.lists(text, max_size=2),
        "candidateCount": st.integers(0, 2),
        "thinkingConfig": json_values,
    }
)

common = {"model": st.just("m"), "stream": st.booleans(), "temperature": st.floats(0, 2), "top_p": st.floats(0.1, 1)}


def chat_bodies() -> st.SearchStrategy[Any]:
    return _obj(
        {
            **common,
            "tools": st.lists(tool, max_size=2),
            "max_tokens": st.integers(-2, 40),
            "stop": text | st.lists(text, max_size=2),
            "n": st.integers(0, 2),
            "stream_options": _obj({"include_usage": st.booleans()}),
            "modalities": json_values,
        },
        {"messages": st.lists(chat_msg, min_size=1, max_size=4)},
        wild=False,
    )


def anthropic_bodies() -> st.SearchStrategy[Any]:
    return _obj(
        {
            **common,
            "tools": st.lists(anth_tool, max_size=2),
            "system": text | st.lists(_obj({"type": st.just("text"), "text": text}), max_size=2),
            "max_tokens": st.integers(-2, 40),
            "stop_sequences": st.lists(text, max_size=2),
        },
        {"messages": st.lists(anth_msg, min_size=1, max_size=4)},
        wild=False,
    )


def responses_bodies() -> st.SearchStrategy[Any]:
    return _obj(
        {
            **common,
            "instructions": text,
            "tools": st.lists(resp_tool, max_size=2),
            "max_output_tokens": st.integers(-2, 40),
            "previous_response_id": st.none() | text,
        },
        {"input": text | st.lists(item, min_size=1, max_size=4)},
        wild=False,
    )


def gemini_bodies() -> st.SearchStrategy[Any]:
    return _obj(
        {
            "systemInstruction": text | _obj({"parts": st.lists(_obj({"text": text}), max_size=2)}),
            "tools": st.lists(gem_tool, max_size=2),
            "generationConfig": gem_config,
            "toolConfig": json_values,
            "safetySettings": json_values,
        },
        {"contents": st.lists(gem_content, min_size=1, max_size=4)},
        wild=False,
    )


BODIES = {CHAT: chat_bodies, MSGS: anthropic_bodies, RESP: responses_bodies, GEM: gemini_bodies}
STREAM_ENDS = {
    CHAT: (b"data: [DONE]",),
    MSGS: (b"event: message_stop", b"event: error"),
    RESP: (b"event: response.completed", b"event: response.incomplete", b"event: error"),
    GEM: (b'"finishReason"', b'{"error":'),
}


def is_dialect_error(path: str, j: Any) -> bool:
    """The body of a 4xx has the dialect's error shape."""
    if path == MSGS:
        return isinstance(j, dict) and j.get("type") == "error" and set(j.get("error", {})) == {"type", "message"}
    if path.startswith("/v1beta/"):  # Google's shape
        return isinstance(j, dict) and set(j) == {"error"} and set(j["error"]) == {"code", "message", "status"}
    return isinstance(j, dict) and set(j) == {"error"} and {"message", "type"} <= set(j["error"])


class ThreadedProxy:
    """A ProxyServer on its own event loop in a thread, for sync clients (hypothesis)."""

    def __init__(self, make_server: Any) -> None:
        self.make_server = make_server
        self.srv: Any = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self.make_server() as srv:
            self.srv = srv
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ThreadedProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("proxy did not start within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def turns_recorded(out_dir: Path) -> int:
    p = out_dir / "turns.jsonl"
    return sum(1 for _ in p.open("rb")) if p.exists() else 0
