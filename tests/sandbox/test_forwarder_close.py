"""Closing a sandbox's forwarder with a connection still open is silent.

A harness's connection to the proxy is usually still open when its sandbox is torn down
(keep-alive). Closing the forwarder cancels that connection's relay task; on Python 3.11 the
stream server's done-callback then calls `task.exception()` on the cancelled task, which
raises, and asyncio prints "Exception in callback ... CancelledError" with a traceback: eleven
of them in one cross-harness evaluation's log, for nothing that went wrong.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from legorl.sandbox.forwarder import Forwarder


def test_closing_with_an_open_connection_reports_nothing(tmp_path: Path) -> None:
    async def main() -> list[dict[str, Any]]:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        arrived = asyncio.Event()

        async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(5)
            arrived.set()
            await reader.read()  # held open, like a keep-alive connection

        target = str(tmp_path / "proxy.sock")
        server = await asyncio.start_unix_server(upstream, target)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        fwd = await Forwarder(listener, target).start()
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
