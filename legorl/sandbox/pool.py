"""Pre-started sandboxes and start retries, in front of any backend.

    pool = SandboxPool(DockerBackend(store), size=4)
    await pool.prewarm(SandboxSpec(image=task.key))       # optional: fill before the clock starts
    sb = await pool.start(SandboxSpec(image=task.key, proxy_socket=session_sock))

Why: starting a Docker container costs hundreds of milliseconds to seconds (more on a
quota-enforcing storage driver), which would dominate short rollouts. The pool keeps up to
`size` sandboxes already running per *shape* (image, limits, read-only mounts, proxy port)
and hands one out at once; the per-sandbox parts of a spec (workdir, env, proxy socket) are
applied at hand-out, so one warm sandbox serves any rollout of that shape. A sandbox is
still used once: closing it destroys it, and the pool starts a replacement in the
background. Start failures (`SandboxError`) are retried with exponential back-off before
they reach the caller, who then records an infrastructure error (never the agent's).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import deque
from typing import Protocol

from legorl.sandbox.base import Limits, SandboxError, SandboxSpec
from legorl.sandbox.channel import ChannelSandbox

log = logging.getLogger(__name__)

_Shape = tuple[str, Limits, tuple[tuple[str, str], ...], int]


class ChannelBackend(Protocol):
    """A backend whose sandboxes can be re-pointed at a proxy socket (local, docker)."""

    name: str

    async def start(self, spec: SandboxSpec) -> ChannelSandbox: ...


def _shape(spec: SandboxSpec) -> _Shape:
    return (spec.image, spec.limits, tuple(sorted(spec.readonly_mounts.items())), spec.proxy_port)


class SandboxPool:
    """A `Backend` that hands out pre-started sandboxes and retries failed starts."""

    def __init__(self, backend: ChannelBackend, size: int = 2, retries: int = 2, backoff_s: float = 0.25) -> None:
        if size < 0 or retries < 0:
            raise ValueError(f"SandboxPool: size ({size}) and retries ({retries}) must be >= 0")
        self.backend = backend
        self.name = backend.name
        self.size = size
        self.retries = retries
        self.backoff_s = backoff_s
        self._idle: dict[_Shape, deque[ChannelSandbox]] = {}
        self._filling: dict[_Shape, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.hits = 0
        self.misses = 0

    async def _start_retrying(self, spec: SandboxSpec) -> ChannelSandbox:
        for attempt in range(self.retries + 1):
            try:
                return await self.backend.start(spec)
            except SandboxError as e:
                if attempt == self.retries:
                    raise
                log.warning("sandbox start failed (attempt %d of %d): %s", attempt + 1, self.retries + 1, e)
                await asyncio.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    async def start(self, spec: SandboxSpec) -> ChannelSandbox:
        """A running sandbox for `spec`: a warm one if the pool has it, else a fresh one."""
        shape = _shape(spec)
        idle = self._idle.setdefault(shape, deque())
        sandbox = None
        while idle:
            candidate = idle.popleft()
            if candidate.channel.alive:
                sandbox = candidate
                break
            await candidate.close()
        if sandbox is None:
            self.misses += 1
            sandbox = await self._start_retrying(_template(spec))
        else:
            self.hits += 1
        self._refill(shape, spec)
        sandbox.spec = spec
        try:
            await sandbox.set_proxy(spec.proxy_socket)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    def _refill(self, shape: _Shape, spec: SandboxSpec) -> None:
        missing = self.size - len(self._idle.get(shape, ())) - self._filling.get(shape, 0)
        for _ in range(max(missing, 0)):
            self._filling[shape] = self._filling.get(shape, 0) + 1
            task = asyncio.create_task(self._fill_one(shape, _template(spec)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fill_one(self, shape: _Shape, spec: SandboxSpec) -> None:
        try:
            sandbox = await self._start_retrying(spec)
        except SandboxError as e:
            log.warning("pool could not pre-start a sandbox: %s", e)
            return
        finally:
            self._filling[shape] -= 1
        self._idle.setdefault(shape, deque()).append(sandbox)

    async def prewarm(self, spec: SandboxSpec, n: int | None = None) -> None:
        """Start sandboxes of `spec`'s shape until `n` (default: size) are idle."""
        shape = _shape(spec)
        idle = self._idle.setdefault(shape, deque())
        want = self.size if n is None else n
        started = await asyncio.gather(
            *(self._start_retrying(_template(spec)) for _ in range(max(want - len(idle), 0))), return_exceptions=True
        )
        for result in started:
            if isinstance(result, BaseException):
                log.warning("pool could not pre-start a sandbox: %s", result)
            else:
                idle.append(result)

    def idle(self, spec: SandboxSpec) -> int:
        return len(self._idle.get(_shape(spec), ()))

    async def aclose(self) -> None:
        """Close every idle sandbox and stop refilling (handed-out ones are the caller's)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for idle in self._idle.values():
            while idle:
                await idle.popleft().close()


def _template(spec: SandboxSpec) -> SandboxSpec:
    return dataclasses.replace(spec, proxy_socket=None, env={})
