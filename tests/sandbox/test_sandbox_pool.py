"""SandboxPool: warm hand-out with per-rollout parts applied, refill, retries, cleanup."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from legorl.sandbox import ImageRef, ImageStore, SandboxError, SandboxSpec, open_backend
from legorl.sandbox.channel import ChannelSandbox
from legorl.sandbox.pool import SandboxPool


async def _echo_server(path: str) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\npong")
        await writer.drain()
        writer.close()

    return await asyncio.start_unix_server(handle, path)


async def test_warm_hand_out_applies_the_rollouts_spec(backend, base: ImageRef, tmp_path: Path) -> None:
    pool = SandboxPool(backend, size=2)
    template = SandboxSpec(image=base.key, workdir="/tmp")
    await pool.prewarm(template)
    assert pool.idle(template) == 2
    sock = str(tmp_path / "proxy.sock")
    server = await _echo_server(sock)
    try:
        spec = SandboxSpec(image=base.key, workdir="/root", env={"ROLL": "r1"}, proxy_socket=sock)
        async with await pool.start(spec) as sb:
            assert pool.hits == 1 and pool.misses == 0
            res = await sb.exec(
                'echo $ROLL; pwd; python3 -c "import urllib.request as u; '
                f"print(u.urlopen('{sb.proxy_url}/ping').read().decode())\""
            )
            assert res.stdout == "r1\n/root\npong\n", res
        for _ in range(1200):  # the pool starts a replacement in the background
            if pool.idle(template) == 2:
                break
            await asyncio.sleep(0.1)
        assert pool.idle(template) == 2
    finally:
        server.close()
        await pool.aclose()
    assert pool.idle(template) == 0


class _Flaky:
    """A backend whose first `fails` starts fail the way an infrastructure fault would."""

    name = "flaky"

    def __init__(self, inner, fails: int) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.fails, self.calls = inner, fails, 0

    async def start(self, spec: SandboxSpec) -> ChannelSandbox:
        self.calls += 1
        if self.calls <= self.fails:
            raise SandboxError(f"injected start failure {self.calls}")
        return await self.inner.start(spec)


async def test_start_failures_are_retried_then_raised(store: ImageStore, base: ImageRef) -> None:
    local = open_backend("local", store)
    try:
        flaky = _Flaky(local, fails=2)
        pool = SandboxPool(flaky, size=0, retries=2, backoff_s=0.01)
        async with await pool.start(SandboxSpec(image=base.key, workdir="/")) as sb:
            assert (await sb.exec("echo ok")).stdout == "ok\n"
        assert flaky.calls == 3
        pool = SandboxPool(_Flaky(local, fails=5), size=0, retries=1, backoff_s=0.01)
        with pytest.raises(SandboxError, match="injected start failure 2"):
            await pool.start(SandboxSpec(image=base.key))
        with pytest.raises(ValueError, match="size"):
            SandboxPool(local, size=-1)
    finally:
        await local.aclose()


async def test_aclose_stops_idle_sandboxes(store: ImageStore, base: ImageRef) -> None:
    local = open_backend("local", store)
    pool = SandboxPool(local, size=2)
    spec = SandboxSpec(image=base.key)
    await pool.prewarm(spec)
    paths = [sb.netns_path for sb in pool._idle[next(iter(pool._idle))]]
    assert all(os.path.exists(p) for p in paths)
    await pool.aclose()
    await local.aclose()
    assert not any(os.path.exists(p) for p in paths)
