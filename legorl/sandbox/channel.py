"""The host side of a sandbox: talks to its init (`in_sandbox/init.py`) and implements `Sandbox`.

Both backends hand `ChannelSandbox` a byte stream to the sandbox's init plus three small
callables (cgroup counters, network namespace path, cleanup), so every behaviour the
contract tests check (exec, timeouts, limits, files, diff, the proxy forwarder) is one
implementation, not two. Replies from the init are treated as untrusted: a sandbox's
processes run as root next to it, so sizes are bounded and a malformed frame is a fault of
that sandbox, never a crash of the host.

Classifying an exec: `ExecResult.oom_killed` / `pids_limited` are read from the sandbox's
cgroup counters before and after the command; `disk_full` from the free space left on the
sandbox's root filesystem (under 1 MiB), or the kernel's ENOSPC/EDQUOT message in the
command's output. All three are agent-caused. `SandboxError` is raised only for faults of
the machinery itself (init unresponsive or gone without a resource cause); `SandboxLost`
(`host_oom`) when a process was OOM-killed while the sandbox never reached its own memory
limit (`Counters.host_oom_since`): the host or an enclosing cgroup ran out, not the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import shlex
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from legorl.sandbox.base import (
    DiffError,
    ExecResult,
    SandboxError,
    SandboxLost,
    SandboxSpec,
)
from legorl.sandbox.cgroups import Counters
from legorl.sandbox.forwarder import Forwarder, forward

log = logging.getLogger(__name__)

HDR = struct.Struct(">II")
MAX_JSON = 1 << 20
MAX_FILE = 256 << 20
DIFF_LIMIT = 64 << 20
DISK_FULL_BYTES = 1 << 20
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "USER": "root",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_ROOT_USER_ACTION": "ignore",
}
_ENOSPC_TEXT = (b"No space left on device", b"Disk quota exceeded")
HOST_OOM = "host_oom"  # SandboxLost cause: an OOM killer outside the sandbox's own limit


class ChannelClosed(SandboxError):
    """The sandbox's init went away."""


class InitChannel:
    """Framed request/response over a stream to one sandbox's init."""

    def __init__(self, reader: asyncio.StreamReader, write: Callable[[bytes], None], max_payload: int) -> None:
        self._reader = reader
        self._write = write
        self._max_payload = max_payload
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}
        self._ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._read_loop())
        self.closed_reason = ""

    async def _read_frame(self) -> tuple[dict[str, Any], bytes]:
        jlen, plen = HDR.unpack(await self._reader.readexactly(HDR.size))
        if jlen > MAX_JSON or plen > self._max_payload:
            raise SandboxError(f"sandbox sent an oversized frame ({jlen} + {plen} bytes)")
        head = json.loads(await self._reader.readexactly(jlen))
        if not isinstance(head, dict):
            raise SandboxError("sandbox sent a malformed frame")
        return head, await self._reader.readexactly(plen)

    async def _read_loop(self) -> None:
        try:
            while True:
                head, payload = await self._read_frame()
                if head.get("op") == "ready":
                    if not self._ready.done():
                        self._ready.set_result(head)
                elif head.get("op") == "error":
                    raise SandboxError(f"sandbox failed to start: {head.get('error')}")
                else:
                    fut = self._pending.pop(head.get("id"), None)  # type: ignore[arg-type]
                    if fut is not None and not fut.done():
                        fut.set_result((head, payload))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self.closed_reason = "the sandbox's init exited"
        except (SandboxError, ValueError) as e:
            self.closed_reason = str(e)
        except asyncio.CancelledError:
            self.closed_reason = "channel closed"
        err = ChannelClosed(self.closed_reason)
        # A waiter may be gone (a shielded wait that timed out or was cancelled): mark each
        # exception retrieved, so that no "exception was never retrieved" noise follows.
        for fut in [self._ready, *self._pending.values()]:
            if not fut.done():
                fut.set_exception(err)
                fut.exception()
        self._pending.clear()

    @property
    def alive(self) -> bool:
        return not self._task.done()

    async def ready(self, timeout_s: float) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)
        except TimeoutError as e:
            raise SandboxError(f"sandbox init did not start within {timeout_s:.0f} s") from e

    def send_nowait(
        self, msg: dict[str, Any], payload: bytes = b""
    ) -> tuple[int, asyncio.Future[tuple[dict[str, Any], bytes]]]:
        """Send a request now (in order); returns its id and the future of its reply."""
        rid = next(self._ids)
        msg = {**msg, "id": rid}
        fut: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        if not self.alive:
            fut.set_exception(ChannelClosed(self.closed_reason or "sandbox is closed"))
            return rid, fut
        self._pending[rid] = fut
        head = json.dumps(msg).encode()
        try:
            self._write(HDR.pack(len(head), len(payload)) + head + payload)
        except (ConnectionError, OSError, RuntimeError) as e:
            self._pending.pop(rid, None)
            fut.set_exception(ChannelClosed(f"cannot write to the sandbox's init: {e}"))
        return rid, fut

    def discard(self, rid: int) -> None:
        """Stop waiting for the reply to `rid` (its caller was cancelled)."""
        fut = self._pending.pop(rid, None)
        if fut is not None and not fut.done():
            fut.cancel()

    async def request(
        self, msg: dict[str, Any], payload: bytes = b"", timeout_s: float = 30.0
    ) -> tuple[dict[str, Any], bytes]:
        _, fut = self.send_nowait(msg, payload)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError as e:
            raise SandboxError(f"sandbox init did not answer {msg.get('op')} within {timeout_s:.0f} s") from e

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


class ChannelSandbox:
    """A running sandbox of either backend (implements `legorl.sandbox.base.Sandbox`).

    `proxy_url` is the base URL a harness inside should use (None without a proxy socket).
    """

    def __init__(
        self,
        id: str,
        spec: SandboxSpec,
        channel: InitChannel,
        *,
        netns_path: str,
        counters: Callable[[], Counters],
        cleanup: Callable[[], Awaitable[None]],
        commit_aliases: dict[str, str] | None = None,
        lost: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        self.id = id
        self._lost = lost
        self.spec = spec
        self.channel = channel
        self.netns_path = netns_path
        self._counters = counters
        self._cleanup = cleanup
        self.commit_aliases = dict(commit_aliases or {})
        self._forwarder: Forwarder | None = None
        self._closed = False
        self.proxy_url: str | None = None

    async def set_proxy(self, proxy_socket: str | None) -> None:
        """(Re)point the loopback forwarder at `proxy_socket` (pools bind it at hand-out)."""
        if self._forwarder is not None:
            await self._forwarder.close()
            self._forwarder, self.proxy_url = None, None
        if proxy_socket:
            try:
                self._forwarder = await forward(self.netns_path, self.spec.proxy_port, proxy_socket)
            except OSError as e:
                raise SandboxError(f"sandbox {self.id}: proxy forwarder failed: {e}") from e
            self.proxy_url = f"http://127.0.0.1:{self.spec.proxy_port}"

    async def lost_cause(self) -> str | None:
        """Why the sandbox died when nothing in it did it: the backend's answer (the init's
        wait status, its cgroup's OOM count), asked only once the channel is gone."""
        if self.channel.alive or self._lost is None:
            return None
        c = self._counters()
        if c.host_oom_since(Counters()):
            return HOST_OOM
        if c.oom_kills:  # its own memory limit: what the agent did
            return None
        return await self._lost()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")

    async def exec(
        self,
        cmd: str,
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        """Run `cmd` with /bin/sh; its whole process tree is killed after `timeout_s`."""
        self._check_open()
        limit = output_limit or self.spec.limits.output_bytes
        full_env = {**BASE_ENV, **self.spec.env, **(env or {})}
        before = self._counters()
        req = {
            "op": "exec",
            "cmd": cmd,
            "cwd": cwd or self.spec.workdir,
            "env": full_env,
            "timeout": timeout_s,
            "limit": limit,
        }
        t0 = time.monotonic()
        rid, fut = self.channel.send_nowait(req)
        try:
            head, payload = await asyncio.wait_for(asyncio.shield(fut), timeout_s + 15.0)
        except TimeoutError as e:
            raise SandboxError(f"sandbox {self.id}: init did not report on a {timeout_s:.0f} s command") from e
        except asyncio.CancelledError:
            self.channel.discard(rid)
            if self.channel.alive:
                _, kill = self.channel.send_nowait({"op": "kill", "target": rid})
                kill.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise
        except ChannelClosed:
            after = self._counters()
            if after.host_oom_since(before):
                raise SandboxLost(
                    f"sandbox {self.id}: killed by an out-of-memory killer outside its own limit", HOST_OOM
                ) from None
            if after.oom_kills > before.oom_kills:
                return ExecResult(
                    -9,
                    "",
                    "sandbox: killed by the out-of-memory killer",
                    duration_s=time.monotonic() - t0,
                    oom_killed=True,
                )
            raise
        after = self._counters()
        if after.host_oom_since(before):  # not the agent's doing: its command must not count against it
            raise SandboxLost(
                f"sandbox {self.id}: a process was killed by an out-of-memory killer outside its own limit", HOST_OOM
            )
        oom = after.oom_kills > before.oom_kills
        pids = after.pids_max_hits > before.pids_max_hits
        if not head.get("ok"):
            msg = f"sandbox: cannot run the command: {head.get('error')}"
            return ExecResult(126, "", msg, duration_s=time.monotonic() - t0, oom_killed=oom, pids_limited=pids)
        out_len = int(head["out_len"])
        out, err = payload[:out_len], payload[out_len:]
        disk_full = 0 <= int(head.get("disk_free", -1)) < DISK_FULL_BYTES or any(
            t in out or t in err for t in _ENOSPC_TEXT
        )
        return ExecResult(
            exit_code=int(head["exit"]),
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=bool(head["timed_out"]),
            truncated=bool(head["truncated"]),
            duration_s=float(head.get("duration", time.monotonic() - t0)),
            oom_killed=oom,
            pids_limited=pids,
            disk_full=disk_full,
        )

    async def read_file(self, path: str) -> bytes:
        self._check_open()
        head, payload = await self.channel.request({"op": "read", "path": self._abs(path), "limit": MAX_FILE})
        if not head.get("ok"):
            raise OSError(int(head.get("errno") or 5), f"{path}: {head.get('error')}")
        return payload

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._check_open()
        if len(data) > MAX_FILE:
            raise ValueError(f"{path}: {len(data)} bytes is over the {MAX_FILE}-byte file limit")
        head, _ = await self.channel.request({"op": "write", "path": self._abs(path), "mode": mode}, data)
        if not head.get("ok"):
            raise OSError(int(head.get("errno") or 5), f"{path}: {head.get('error')}")

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.spec.workdir.rstrip('/')}/{path}"

    async def diff(self, base_commit: str, repo: str | None = None) -> str:
        """The repository's state against `base_commit`, tracked and new (non-ignored) files,
        as a binary-safe git patch. The agent's own index is left untouched. Raises
        DiffError when the repository cannot produce one (the agent's doing)."""
        base = self.commit_aliases.get(base_commit, base_commit)
        script = _DIFF_SCRIPT.format(base=shlex.quote(base))
        res = await self.exec(script, timeout_s=300, cwd=repo or self.spec.workdir, output_limit=DIFF_LIMIT)
        if res.truncated:
            raise DiffError(f"diff against {base_commit} is over {DIFF_LIMIT} bytes")
        if res.exit_code != 0:
            raise DiffError(f"no diff against {base_commit}: {res.stderr.strip()[-500:]}")
        return res.stdout

    async def close(self) -> None:
        """Stop everything in the sandbox and remove what it held. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._forwarder is not None:
            await self._forwarder.close()
            self._forwarder = None
        await self._cleanup()

    async def __aenter__(self) -> ChannelSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# A temporary index seeded from the agent's: `add -A` brings in every change and new file
# (respecting .gitignore) without touching the agent's staging. Config that would run
# programs (fsmonitor, hooks, external diff) is switched off for this call.
_DIFF_SCRIPT = """set -e
git rev-parse --verify -q {base}^{{commit}} >/dev/null || {{ echo "base commit {base} is not in $(pwd)" >&2; exit 3; }}
idx=$(mktemp /tmp/.legorl-index.XXXXXX)
trap 'rm -f "$idx"' EXIT
gd="$(git rev-parse --git-dir)"
cp "$gd/index" "$idx" 2>/dev/null || rm -f "$idx"
export GIT_INDEX_FILE="$idx"
G="git -c core.fsmonitor= -c core.hooksPath=/dev/null -c core.quotepath=off"
$G add -A .
$G diff --cached --binary --no-color --no-ext-diff --no-renames {base}
"""
