"""Who may talk to our HTTP services: a token, and a `Host` header that names the bound address.

Why: every service we start (the proxy inside `legorl train`, `legorl proxy`, `legorl ui`,
`legorl engine-serve`) listens on a TCP port that any local process can reach, and a web page
can reach it too by DNS rebinding (its own name resolved to 127.0.0.1). Without a credential, a
local process could list a run's sessions, write a turn into a live rollout or close one; a
page could do the same through the victim's browser. So:

- each service holds a secret token; a request carries it as `Authorization: Bearer <token>`
  (or `x-api-key`), except where a service says otherwise (the UI's cookie, the proxy's
  session keys). Tokens are compared in constant time;
- on a loopback bind, the `Host` header must name that address (`127.0.0.1:<port>`,
  `localhost:<port>`, `[::1]:<port>`): a rebinding page sends its own name and is refused.
  Off loopback the token alone decides (the host has names we cannot list);
- a service runs without a token only when its operator says `--insecure`, and only on
  loopback (`policy`).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

import orjson

TOKEN_ENV = "LEGORL_TOKEN"  # where a service reads its token when no --token is given
TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~-]+")  # URL-, cookie- and key-safe (new_token's alphabet)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a service on this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe), never beginning with "-": one in 64 would,
    and a command line reads such a value after `--token` or `--api-key` as an option."""
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return token


def policy(what: str, host: str, token: str | None, insecure: bool) -> str | None:
    """The token a service started with `--token`/`--insecure` on `host` must require: the
    given one, else `$LEGORL_TOKEN`, else a fresh one (the caller prints it); None only with
    `--insecure` on loopback. Raises SystemExit with one line for `--insecure` off loopback."""
    if insecure:
        if not is_loopback(host):
            raise SystemExit(
                f"legorl {what}: --insecure serves without a token and is allowed on loopback only, "
                f"not on {host!r}; drop --insecure (a token is then required) or bind 127.0.0.1"
            )
        return None
    chosen = token or os.environ.get(TOKEN_ENV) or new_token()
    if not TOKEN_CHARS.fullmatch(chosen):
        raise SystemExit(
            f"legorl {what}: a token may hold only letters, digits and . _ ~ - (it travels in API keys, "
            "after which a ':' names the session, in URLs and in a cookie)"
        )
    return chosen


def same(given: str | None, secret: str) -> bool:
    """Constant-time comparison of a presented token with the secret."""
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode())


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for k, v in headers:
        if k == name:
            return v.decode("latin-1").strip()
    return None


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The credential of a request: `x-api-key`, else `Authorization: Bearer <token>`."""
    key = header(headers, b"x-api-key")
    if key:
        return key
    auth = header(headers, b"authorization")
    if not auth:
        return None
    return auth[7:].strip() if auth[:7].lower() == "bearer " else auth


@dataclass
class HostCheck:
    """The `Host` values a loopback-bound service accepts (none checked off loopback)."""

    bind_host: str
    port: int = 0
    _allowed: frozenset[str] = field(default=frozenset(), init=False)

    def bound(self, port: int) -> HostCheck:
        """Set the port once it is known (a bind to port 0 learns it only then)."""
        self.port = port
        names = {"localhost", "127.0.0.1", "[::1]", self.bind_host}
        if ":" in self.bind_host and not self.bind_host.startswith("["):
            names.add(f"[{self.bind_host}]")
        self._allowed = frozenset({*names, *(f"{n}:{port}" for n in names)})
        return self

    @property
    def checked(self) -> bool:
        return is_loopback(self.bind_host)

    def ok(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether the request's `Host` names this service (a missing one is allowed: no
        browser omits it, so it cannot be a rebinding page)."""
        if not self.checked:
            return True
        host = header(headers, b"host")
        return host is None or host.lower() in self._allowed

    def refusal(self, headers: list[tuple[bytes, bytes]]) -> str:
        return (
            f"Host {header(headers, b'host')!r} is not this service's address "
            f"({self.bind_host}:{self.port}); requests must name it (DNS rebinding is refused)"
        )


def _json_response(status: int, message: str) -> tuple[dict[str, Any], dict[str, Any]]:
    body = orjson.dumps({"error": message})
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    return start, {"type": "http.response.body", "body": body}


class TokenGate:
    """ASGI wrapper for a browser-facing service (the UI): the `Host` check, then the token
    from a cookie, a bearer header, or `?token=` once — which answers a redirect to the same
    URL without it, setting the cookie (HttpOnly, SameSite=Strict: no other site's page
    sends it), so the token leaves the address bar and every later fetch carries it."""

    def __init__(self, app: Any, token: str | None, hosts: HostCheck | None) -> None:
        self.app, self.token, self.hosts = app, token, hosts

    @property
    def cookie(self) -> str:
        # cookies are not kept apart by port: two services on one host keep two cookies
        return f"legorl_token_{self.hosts.port if self.hosts is not None else 0}"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        refusal: tuple[int, str] | None = None
        if self.hosts is not None and not self.hosts.ok(headers):
            refusal = (403, self.hosts.refusal(headers))
        elif self.token is not None:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            given = (query.get("token") or [None])[0]
            if given is not None and same(given, self.token) and scope["type"] == "http":
                rest = urlencode([(k, v) for k, vs in query.items() if k != "token" for v in vs])
                where = scope.get("root_path", "") + scope["path"] + (f"?{rest}" if rest else "")
                cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                await send(
                    {
                        "type": "http.response.start",
                        "status": 303,
                        "headers": [
                            (b"location", where.encode("latin-1", "replace")),
                            (b"set-cookie", cookie.encode()),
                            (b"content-length", b"0"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return
            if not (same(_cookie(headers, self.cookie), self.token) or same(bearer(headers), self.token)):
                refusal = (401, "this service requires its token: open the URL it printed (it carries ?token=)")
        if refusal is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008})
            return
        start, body = _json_response(*refusal)
        await send(start)
        await send(body)


def _cookie(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    for k, v in headers:
        if k == b"cookie":
            for part in v.decode("latin-1").split(";"):
                key, _, value = part.strip().partition("=")
                if key == name:
                    return value
    return None
