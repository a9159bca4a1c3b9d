"""The sandbox's only way out: loopback TCP inside the sandbox -> its proxy session's socket.

A harness inside a sandbox needs nothing but a base URL (`http://127.0.0.1:{proxy_port}`),
while the sandbox has no network. We open a listening TCP socket *inside the sandbox's
network namespace* from a short-lived host thread (`setns` switches one thread's network
namespace; the socket keeps the namespace it was created in) and serve it from the host's
event loop, relaying every connection to the host unix socket of the sandbox's own proxy
session. Nothing is added to the sandbox's filesystem and no process runs inside it for
this, so the agent can neither see another path nor kill the relay. The same code serves
both backends: a Docker container's namespace is `/proc/<its pid 1>/ns/net`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import socket
import threading

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, nstype: int) -> None:
    """setns(2) for this thread (Python 3.11 has no os.setns). Its own few lines here: the
    ctypes wrappers of `in_sandbox/linux.py` are the zygote's, read as a file, not imported."""
    if _libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"setns({nstype:#x}): {os.strerror(err)}")


def listen_in_netns(netns_path: str, port: int, host: str = "127.0.0.1") -> socket.socket:
    """A non-blocking TCP socket listening on host:port inside the namespace `netns_path`."""
    out: dict[str, object] = {}

    def work() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(netns_path, os.O_RDONLY)
        try:
            _setns(target, CLONE_NEWNET)
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((host, port))
                    s.listen(128)
                except OSError:
                    s.close()
                    raise
                s.setblocking(False)
                out["sock"] = s
            finally:
                _setns(own, CLONE_NEWNET)  # the thread ends anyway; be tidy
        except OSError as e:
            out["error"] = e
        finally:
            os.close(own)
            os.close(target)

    t = threading.Thread(target=work, name="legorl-netns-listen")
    t.start()
    t.join()
    if "error" in out:
        err = out["error"]
        assert isinstance(err, OSError)
        raise OSError(err.errno, f"cannot listen on {host}:{port} in {netns_path}: {err.strerror}")
    sock = out["sock"]
    assert isinstance(sock, socket.socket)
    return sock


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Copy `reader` into `writer` until an orderly end, passed on as one (True). False when
    either side failed: a reset, or a `writer` already closing, into which asyncio would
    drop the bytes without an error."""
    try:
        while chunk := await reader.read(65536):
            if writer.is_closing():
                return False
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()
        return True
    except (ConnectionError, OSError):
        return False


async def _relay(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter], up: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    """Both directions until both have ended in order, or until one fails: then the other
    side is dropped too. An HTTP server may close a kept-alive connection just as the client
    reuses it; the client then sees a reset and retries on a new connection. Relaying only
    the failed direction would leave the harness's request read and never answered, its
    connection open until the sandbox's timeout."""
    directions = {
        asyncio.ensure_future(_pipe(client[0], up[1])),
        asyncio.ensure_future(_pipe(up[0], client[1])),
    }
    try:
        while directions:
            done, directions = await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
            if not all(d.result() for d in done):
                client[1].transport.abort()  # the harness sees a reset, as it would without us
                return
    finally:
        for d in directions:
            d.cancel()


class Forwarder:
    """Relays every connection accepted on `listener` to the unix socket `target`."""

    def __init__(self, listener: socket.socket, target: str) -> None:
        self.listener = listener
        self.target = target
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    async def start(self) -> Forwarder:
        self._server = await asyncio.start_server(self._handle, sock=self.listener)
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            try:
                up_r, up_w = await asyncio.open_unix_connection(self.target)
            except OSError as e:
                log.warning("proxy socket %s unreachable: %s", self.target, e)
                return
            try:
                await _relay((reader, writer), (up_r, up_w))
            finally:
                up_w.close()
        except asyncio.CancelledError:
            # close() cancels a connection still open (a harness's keep-alive); ending as a
            # cancelled task would make Python 3.11's stream server print a traceback from
            # its done-callback (`task.exception()` raises). close() is the only canceller
            # and awaits this task, so returning loses nothing.
            return
        finally:
            writer.close()
            self._conns.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            for task in list(self._conns):
                with contextlib.suppress(BaseException):
                    await task
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        self.listener.close()


async def forward(netns_path: str, port: int, target: str) -> Forwarder:
    """Serve `http://127.0.0.1:{port}` inside the namespace by relaying to `target`."""
    return await Forwarder(listen_in_netns(netns_path, port), target).start()
