"""Parse-time limits on request bodies, and JSON serialisation that cannot raise.

Every request the proxy accepts is recorded (turns.jsonl, the run store), so a body the
recorder cannot write must be refused *before* generation, not discovered after it: orjson
stops at 254 levels of nesting (the recorder wraps the body in two more), the stdlib
encoder the chat template uses at ~1,000 (RecursionError). The limits here
(`ProxyConfig.max_json_depth`, `max_string_chars`, `max_messages`, with `max_body_bytes`
checked while reading) are each answered with a 400 whose message and `param` name the
limit, in the dialect's error shape.

Cost on the hot path: one `orjson.dumps` of the body wrapped in extra lists (orjson's own
recursion limit then does the depth check at C speed: ~10 µs for a 30 KB body, a quarter of
parsing it). The longest-string walk runs only for bodies larger than the string limit.
"""

from __future__ import annotations

from typing import Any

import orjson

from legorl.proxy.errors import ProxyError

ORJSON_MAX_DEPTH = 254  # deepest nesting orjson.dumps writes (a container at depth 255 raises)


def limit_error(limit: str, message: str) -> ProxyError:
    """A 400 naming the exceeded proxy setting (`param` and `code` carry its name)."""
    return ProxyError(400, f"{message} (proxy limit `{limit}`)", "invalid_request", code="limit_exceeded", param=limit)


def depth_within(obj: Any, limit: int) -> bool:
    """Whether `obj` nests at most `limit` containers deep (`obj` itself counts as 1).

    Wrapping `obj` in `254 - limit` lists makes orjson's recursion limit fire exactly when
    `obj` is deeper than `limit`. Anything else orjson refuses (an integer beyond 64 bits,
    a non-str key) is no depth problem: the walk decides then."""
    wrapped = obj
    for _ in range(ORJSON_MAX_DEPTH - limit):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
        return True
    except TypeError as e:
        if "Recursion" in str(e):
            return False
    return _depth(obj, limit) <= limit


def _depth(obj: Any, stop: int) -> int:
    """Nesting depth of containers in `obj`, iterative (never a RecursionError); stops
    counting past `stop`."""
    best = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > best:
            best = d
            if best > stop:
                return best
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values() if isinstance(v, (dict, list)))
        elif isinstance(o, (list, tuple)):
            stack.extend((v, d + 1) for v in o if isinstance(v, (dict, list, tuple)))
    return best


def _longest_string(obj: Any, limit: int) -> tuple[int, str]:
    """(length, path) of the first string (or key) longer than `limit`, or (0, '')."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        o, path = stack.pop()
        if isinstance(o, str):
            if len(o) > limit:
                return len(o), path or "body"
        elif isinstance(o, dict):
            for k, v in o.items():
                if len(k) > limit:
                    return len(k), f"{path}.<key>" if path else "<key>"
                stack.append((v, f"{path}.{k}" if path else k))
        elif isinstance(o, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(o))
    return 0, ""


def check_body(raw: bytes, body: dict[str, Any], max_depth: int, max_string_chars: int, max_messages: int) -> None:
    """Raise the limit's 400 when the parsed `body` (from `raw`) breaks one."""
    if len(raw) > 2 * max_depth and not depth_within(body, max_depth):  # each level takes 2 bytes
        raise limit_error("max_json_depth", f"request body nests arrays/objects more than {max_depth} levels deep")
    if len(raw) > max_string_chars:  # a string has at most as many characters as the body has bytes
        n, path = _longest_string(body, max_string_chars)
        if n:
            raise limit_error(
                "max_string_chars", f"{path}: a string of {n} characters exceeds the limit of {max_string_chars}"
            )
    for key in ("messages", "input", "contents"):
        items = body.get(key)
        if isinstance(items, list) and len(items) > max_messages:
            raise limit_error("max_messages", f"{key}: {len(items)} items exceed the limit of {max_messages}")


# -- serialisation that cannot raise ---------------------------------------------------


def _sanitise(obj: Any, depth: int, limit: int) -> Any:
    """A copy of `obj` orjson can write: containers past `limit` become a marker string,
    integers beyond 64 bits and other unknown objects become their `str`."""
    if isinstance(obj, (str, float, bool)) or obj is None:
        return obj
    if isinstance(obj, int):
        return obj if -(1 << 63) <= obj < (1 << 64) else str(obj)
    if isinstance(obj, (dict, list, tuple)) and depth >= limit:
        return f"<{type(obj).__name__} nested deeper than {limit} levels, dropped>"
    if isinstance(obj, dict):
        return {str(k): _sanitise(v, depth + 1, limit) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_sanitise(v, depth + 1, limit) for v in obj]
    if hasattr(obj, "__dataclass_fields__"):
        return {k: _sanitise(getattr(obj, k), depth + 1, limit) for k in obj.__dataclass_fields__}
    if hasattr(obj, "tolist"):  # numpy arrays (routing)
        return _sanitise(obj.tolist(), depth, limit)
    return str(obj)


def safe_dumps(obj: Any, option: int = 0) -> bytes:
    """orjson.dumps(obj) or, when orjson refuses it, the dump of a sanitised copy (see
    `_sanitise`): a record is written with the offending part marked, never lost."""
    try:
        return orjson.dumps(obj, default=str, option=option)
    except TypeError:
        return orjson.dumps(_sanitise(obj, 1, ORJSON_MAX_DEPTH - 8), default=str, option=option)
