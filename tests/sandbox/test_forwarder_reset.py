"""A proxy connection that dies under a request ends the harness's connection too.

An HTTP server may close an idle keep-alive connection just as the client reuses it: the
client's next request then meets a reset, and an HTTP client retries it on a new
connection. Through the forwarder, that reset used to stop at the relay: the request was
read from the harness, written into the dead unix connection (asyncio drops such writes
without an error) and the harness's own connection stayed open, waiting for an answer that
could not come. Claude Code demonstrations hung this way until the sandbox's timeout (3% of
run 16's and run 21's, docs/measured.md). Now the relay closes the harness's side as soon as
the proxy's side fails, so the client sees what it would have seen without us.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from legorl.sandbox.forwarder import Forwarder


async def _through_forwarder(tmp_path: Path, upstream) -> tuple[bytes, bytes | str]:  # type: ignore[no-untyped-def]
    target = str(tmp_path / "proxy.sock")
    server = await asyncio.start_unix_server(upstream, target)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    fwd = await Forwarder(listener, target).start()
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

    first, second = asyncio.run(_through_forwarder(tmp_path, upstream))
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

    first, second = asyncio.run(_through_forwarder(tmp_path, upstream))
    assert first == b"answer 1"
    assert second in (b"", "closed: ConnectionResetError"), second
