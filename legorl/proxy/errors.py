"""Errors as each dialect's client expects them.

A harness reacts to an error by its shape and wording: Claude Code compacts on an
Anthropic-shaped 400 `prompt is too long: N tokens > M maximum`, OpenCode compacts on an
OpenAI-shaped error mentioning "maximum context length", and both give up cleanly on
other 4xx. So every failure is raised once as a `ProxyError` (status + kind + message)
and rendered here in the shape of the dialect the request came in.
"""

from __future__ import annotations

import orjson

from legorl.types import Dialect

# kind -> Anthropic error type (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "timeout": "timeout_error",
    "rate_limit": "rate_limit_error",
    "permission": "permission_error",
    "engine": "api_error",
    "internal": "api_error",
}
# kind -> OpenAI error type
_OPENAI_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "too_large": "invalid_request_error",
    "timeout": "timeout_error",
    "rate_limit": "rate_limit_error",
    "permission": "permission_error",
    "engine": "server_error",
    "internal": "server_error",
}
# HTTP status -> Google's canonical error status (https://ai.google.dev/gemini-api/docs/troubleshooting)
_GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class ProxyError(Exception):
    """A failure to report to the client: HTTP status, error kind and a message that
    names what was wrong (and, where useful, the offending field in `param`)."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request",
        code: str | None = None,
        param: str | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.close = close  # answer with `connection: close` (the request was not read in full)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param


def bad_request(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, message, "invalid_request", param=param)


CONTEXT_EXCEEDED = "context_length_exceeded"  # the OpenAI code every dialect's overflow error carries here


def context_too_long(dialect: Dialect, n_tokens: int, maximum: int) -> ProxyError:
    """The honest overflow error each harness recognises as 'compact now'."""
    if dialect is Dialect.ANTHROPIC:
        msg = f"prompt is too long: {n_tokens} tokens > {maximum} maximum"
    elif dialect is Dialect.GEMINI:  # Google's wording for an over-long prompt
        msg = f"The input token count ({n_tokens}) exceeds the maximum number of tokens allowed ({maximum})."
    else:
        msg = (
            f"This model's maximum context length is {maximum} tokens. However, your messages "
            f"resulted in {n_tokens} tokens. Please reduce the length of the messages."
        )
    return ProxyError(400, msg, "invalid_request", code=CONTEXT_EXCEEDED)


def error_body(dialect: Dialect | None, err: ProxyError) -> bytes:
    """The JSON body of `err` in the dialect's shape (OpenAI's when the dialect is unknown)."""
    if dialect is Dialect.ANTHROPIC:
        return orjson.dumps(
            {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(err.kind, "api_error"), "message": err.message}}
        )
    if dialect is Dialect.GEMINI:
        return orjson.dumps(
            {"error": {"code": err.status, "message": err.message, "status": _GOOGLE_STATUS.get(err.status, "UNKNOWN")}}
        )
    return orjson.dumps(
        {
            "error": {
                "message": err.message,
                "type": _OPENAI_TYPES.get(err.kind, "server_error"),
                "param": err.param,
                "code": err.code,
            }
        }
    )


def stream_error_event(dialect: Dialect, err: ProxyError) -> bytes:
    """An error that happens after a stream has begun (status 200 already sent)."""
    body = error_body(dialect, err)
    if dialect is Dialect.ANTHROPIC:
        return b"event: error\ndata: " + body + b"\n\n"
    if dialect is Dialect.RESPONSES:
        inner = orjson.loads(body)["error"]
        return b"event: error\ndata: " + orjson.dumps({"type": "error", **inner}) + b"\n\n"
    if dialect is Dialect.GEMINI:
        return b"data: " + body + b"\r\n\r\n"
    return b"data: " + body + b"\n\n"
