"""Typed access to request-body fields, failing with the field's name.

The proxy avoids pydantic on the hot path (a 30 KB body through a validating model costs
more than everything else the proxy does), so each dialect reads the few fields it uses
through these helpers: a wrong type is a 400 that names the field and what was expected,
and every field nobody reads (cache_control, metadata, thinking, ...) is ignored.
"""

from __future__ import annotations

import json
import os
from typing import Any

import orjson

from legorl.proxy.errors import ProxyError, bad_request
from legorl.proxy.render_cache import ByteLRU

IMAGE_PLACEHOLDER = "[image]"
_MISSING = object()


def _type_name(t: type | tuple[type, ...]) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }
    ts = t if isinstance(t, tuple) else (t,)
    return " or ".join(names.get(x, x.__name__) for x in ts if x is not float or int not in ts)


def get(
    obj: dict[str, Any],
    key: str,
    types: type | tuple[type, ...],
    where: str,
    default: Any = None,
    required: bool = False,
) -> Any:
    """obj[key] checked against `types` (bool is never taken for a number); null → default."""
    v = obj.get(key, _MISSING)
    if v is _MISSING or v is None:
        if required:
            raise bad_request(f"{where}{key}: required field is missing", param=f"{where}{key}")
        return default
    ts = types if isinstance(types, tuple) else (types,)
    if isinstance(v, bool) and bool not in ts:
        ok = False
    else:
        ok = isinstance(v, ts)
    if not ok:
        raise bad_request(
            f"{where}{key}: expected {_type_name(types)}, got {type(v).__name__} {_short(v)}", param=f"{where}{key}"
        )
    return v


def number(obj: dict[str, Any], key: str, where: str = "") -> float | None:
    return get(obj, key, (int, float), where)


def positive_int(obj: dict[str, Any], key: str, where: str = "") -> int | None:
    v = get(obj, key, int, where)
    if v is not None and v < 1:
        raise bad_request(f"{where}{key}: must be at least 1, got {v}", param=f"{where}{key}")
    return v


def stop_list(obj: dict[str, Any], key: str) -> tuple[str, ...]:
    v = obj.get(key)
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return tuple(s for s in v if s)
    raise bad_request(f"{key}: expected a string or an array of strings, got {_short(v)}", param=key)


def as_list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise bad_request(f"{where}: expected an array, got {type(v).__name__} {_short(v)}", param=where)
    return v


def as_dict(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise bad_request(f"{where}: expected an object, got {type(v).__name__} {_short(v)}", param=where)
    return v


def json_args(v: Any, where: str) -> str:
    """Tool-call arguments as JSON text (some clients send an object instead of a string)."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict):
        return orjson.dumps(v).decode()
    if v is None:
        return "{}"
    raise bad_request(f"{where}: expected a JSON string or object, got {type(v).__name__}", param=where)


_INPUT_CACHE: dict[bytes, str] = ByteLRU(32 * 1024 * 1024)  # bounded in bytes too: inputs can be megabytes


def tool_input_json(v: Any, where: str) -> str:
    """A tool call's input object (Anthropic `tool_use.input`, Gemini `functionCall.args`) as
    the chat template's `tojson` writes it (`json.dumps` spacing, which is also how the policy
    writes arguments), memoised on its compact form: Claude Code replays the whole history
    every call and the stdlib encoder is slow."""
    if not isinstance(v, dict):
        raise bad_request(f"{where}: expected an object, got {type(v).__name__}", param=where)
    try:
        key = orjson.dumps(v)
    except TypeError:  # e.g. an integer beyond 64 bits: not worth caching
        return json.dumps(v, ensure_ascii=False)
    text = _INPUT_CACHE.get(key)
    if text is None:
        if len(_INPUT_CACHE) >= 8192:
            _INPUT_CACHE.clear()
        text = _INPUT_CACHE[key] = json.dumps(v, ensure_ascii=False)
    return text


def unsupported(what: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, f"{what} is not supported by this proxy", "invalid_request", param=param)


def new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."
