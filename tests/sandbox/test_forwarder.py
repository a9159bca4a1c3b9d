"""The sandbox's forwarder: what a harness sees when its connection to the proxy ends.

Closing the forwarder with a connection still open is silent. A harness's connection to
the proxy is usually still open when its sandbox is torn down (keep-alive). Closing the
forwarder cancels that connection's relay task; on Python 3.11 the stream server's
done-callback then calls `task.exception()` on the cancelled task, which raises, and asyncio
printed "Exception in callback ... CancelledError" with a traceback: eleven of them in one
cross-harness evaluation's log, for nothing that went wrong.

A proxy connection that dies under a request ends the harness's connection too. An HTTP
server may close an idle keep-alive connection just as the client reuses it: the client's
next request then meets a reset, and an HTTP client retries it on a new connection. Through
the forwarder, that reset used to stop at the relay: the request was read from the harness,
written into the dead unix connection (asyncio drops such writes without an error) and the
harness's own connection stayed open, waiting for an answer that could not come. Claude Code
demonstrations hung this way until the sandbox's timeout (3% of run 16's and run 21's,
docs/measured.md). Now the relay closes the harness's side as soon as the proxy's side
fails, so the client sees what it would have seen without us.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from legorl.sandbox.forwarder import Forwarder

Upstream = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _forwarding(tmp_path: Path, upstream: Upstream) -> tuple[asyncio.AbstractServer, Forwarder]:
    """A unix server standing for the proxy's session socket, and a forwarder to it on a
    loopback port."""
    target = str(tmp_path / "proxy.sock")
    server = await asyncio.start_unix_server(upstream, target)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return server, await Forwarder(listener, target).start()


def test_closing_with_an_open_connection_reports_nothing(tmp_path: Path) -> None:
    async def main() -> list[dict[str, Any]]:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        arrived = asyncio.Event()

        async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(5)
            arrived.set()
            await reader.read()  # held open, like a keep-alive connection

        server, fwd = await _forwarding(tmp_path, upstream)
        _, writer = await asyncio.open_connection("127.0.0.1", fwd.port)
        writer.write(b"hello")
        await asyncio.wait_for(arrived.wait(), 10)
        await fwd.close()
        writer.close()
        server.close()
        for _ in range(5):  # the done-callbacks run on the loop's next turns
            await asyncio.sleep(0)
        return reported

    assert asyncio.run(main()) == []


async def _two_requests(tmp_path: Path, upstream: Upstream) -> tuple[bytes, bytes | str]:
    """Two requests on one kept-alive connection through the forwarder: the first answer,
    and what the second met."""
    server, fwd = await _forwarding(tmp_path, upstream)
    reader, writer = await asyncio.open_connection("127.0.0.1", fwd.port)
    try:
        writer.write(b"request 1")
        first = await asyncio.wait_for(reader.read(100), 5)
        writer.write(b"request 2")
        try:
            second: bytes | str = await asyncio.wait_for(reader.read(100), 5)
        except TimeoutError:
            second = "no answer and still open after 5 s"
        except ConnectionError as e:
            second = f"closed: {type(e).__name__}"
        return first, second
    finally:
        writer.close()
        await fwd.close()
        server.close()


def test_a_reset_under_the_next_request_closes_the_harness_connection(tmp_path: Path) -> None:
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.transport.pause_reading()  # what arrives next stays in the socket, unread
        writer.write(b"answer 1")
        await writer.drain()
        await asyncio.sleep(0.5)  # the next request arrives...
        writer.transport.abort()  # ...as the server drops the connection: a reset, not an end

    first, second = asyncio.run(_two_requests(tmp_path, upstream))
    assert first == b"answer 1"
    assert second in (b"", "closed: ConnectionResetError"), second


def test_a_request_after_the_proxy_closed_the_connection_is_not_swallowed(tmp_path: Path) -> None:
    """The proxy ends the connection in an orderly way (its keep-alive timeout) before the
    next request: the harness sees the end, not silence."""

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"answer 1")
        await writer.drain()
        writer.close()

    first, second = asyncio.run(_two_requests(tmp_path, upstream))
    assert first == b"answer 1"
    assert second in (b"", "closed: ConnectionResetError"), second
