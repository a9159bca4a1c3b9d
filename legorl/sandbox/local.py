"""The `local` backend: Linux namespaces + overlayfs + cgroups, no daemon needed (root only).

    store = ImageStore()
    backend = LocalBackend(store)
    async with await backend.start(SandboxSpec(image=task_ref.key, proxy_socket=sock)) as sb:
        res = await sb.exec("python -m pytest -x", timeout_s=600)
        patch = await sb.diff(task.base_commit)
    await backend.aclose()

A sandbox is: pid 1 (the shared init, `in_sandbox/init.py`) in fresh pid/mount/net/ipc/uts/cgroup
namespaces and its own user namespace, over an overlay of the image's read-only layers
with the writable upper dir on a tmpfs of `limits.disk_mb` (the disk quota; its pages are
charged to the sandbox's memory cgroup, so disk use also counts against `memory_mb`),
in cgroups limiting memory, pids and CPU. It sees none of the host's files, no other
sandbox, no network but `lo`, and a seccomp filter (`in_sandbox/seccomp.py`, the local twin of
Docker's default profile) denies the syscalls that reach kernel machinery a container
has no business with (namespaces, mounts, keyrings, bpf, io_uring, modules, the clock).
`readonly_mounts` bind extra host dirs read-only, and
`proxy_socket` is reachable at `http://127.0.0.1:{proxy_port}` (see forwarder.py). All
forking happens in a zygote process (see `in_sandbox/zygote.py` for the exact steps and why);
everything a sandbox held is gone when its pid 1 exits, also if this process crashes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from legorl.sandbox.base import BackendLifecycle, SandboxError, SandboxLost, SandboxSpec
from legorl.sandbox.cgroups import Cgroups
from legorl.sandbox.channel import MAX_FILE, ChannelSandbox, InitChannel
from legorl.sandbox.images import ImageStore

log = logging.getLogger(__name__)

ZYGOTE_PATH = str(Path(__file__).parent / "in_sandbox" / "zygote.py")  # read as a file, never imported
START_TIMEOUT_S = 30.0


class _Zygote:
    """Host end of the zygote process; bound to the event loop that started it."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The source goes in on stdin and the environment is minimal: a sandbox's pid 1 is a
        # fork of this process, and its cmdline is readable from inside.
        self.proc = subprocess.Popen(
            ["legorl-sandbox", "-I", "-S", "-"],
            executable=sys.executable,
            pass_fds=[child.fileno()],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env={"LEGORL_ZYGOTE_FD": str(child.fileno()), "LEGORL_SANDBOX_DIR": str(Path(ZYGOTE_PATH).parent)},
        )
        child.close()
        assert self.proc.stdin is not None
        self.proc.stdin.write(Path(ZYGOTE_PATH).read_bytes())
        self.proc.stdin.close()
        self.sock.setblocking(False)
        self.spawned: dict[str, asyncio.Future[int]] = {}
        self.exited: dict[str, asyncio.Future[int]] = {}
        self.statuses: dict[str, int] = {}  # wait status of each sandbox's init, until it is cleaned up
        self.alive = True
        self.loop.add_reader(self.sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        while True:
            try:
                raw = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:
                raw = b""
            if not raw:
                self._died()
                return
            msg: dict[str, Any] = json.loads(raw)
            if "exited" in msg:
                self.statuses[msg["exited"]] = int(msg["status"])
                fut = self.exited.pop(msg["exited"], None)
                if fut is not None and not fut.done():
                    fut.set_result(int(msg["status"]))
            else:
                fut = self.spawned.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    if "error" in msg:
                        fut.set_exception(SandboxError(f"zygote: {msg['error']}"))
                    else:
                        fut.set_result(int(msg["pid"]))

    def _died(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self.loop.remove_reader(self.sock.fileno())
        err = SandboxLost("the local backend's zygote process died", "backend_died")
        for fut in [*self.spawned.values(), *self.exited.values()]:
            if not fut.done():
                fut.set_exception(err)
        for fut in self.exited.values():  # nobody may be waiting on an exit: no "never retrieved"
            fut.exception()
        self.spawned.clear()
        self.exited.clear()

    async def spawn(self, req: dict[str, Any], ctl: socket.socket) -> int:
        if not self.alive:
            raise SandboxLost("the local backend's zygote process died", "backend_died")
        fut: asyncio.Future[int] = self.loop.create_future()
        self.spawned[req["id"]] = fut
        self.exited[req["id"]] = self.loop.create_future()
        data = json.dumps(req).encode()
        for _ in range(1000):
            try:
                socket.send_fds(self.sock, [data], [ctl.fileno()])
                break
            except BlockingIOError:
                await asyncio.sleep(0.002)
        else:
            raise SandboxError("zygote is not accepting requests")
        return await asyncio.wait_for(fut, START_TIMEOUT_S)

    async def wait_exit(self, sid: str, timeout_s: float) -> bool:
        fut = self.exited.get(sid)
        if fut is None:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
            return True
        except (TimeoutError, SandboxError):
            return fut.done()

    async def lost_cause(self, sid: str) -> str | None:
        """`killed_by_signal_N` when the sandbox's init died of a signal (from outside: see
        SandboxLost), `backend_died` when the zygote is gone, else None."""
        if not self.alive:
            return "backend_died"
        await self.wait_exit(sid, 2.0)
        status = self.statuses.get(sid)
        if status is not None and os.WIFSIGNALED(status):
            return f"killed_by_signal_{os.WTERMSIG(status)}"
        return None

    def close(self) -> None:
        self._died()
        self.sock.close()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()


class LocalBackend(BackendLifecycle):
    """Starts sandboxes with namespaces + overlayfs (`async with`, or `aclose()` when done)."""

    name = "local"

    def __init__(self, store: ImageStore | None = None, run_dir: str | Path | None = None) -> None:
        self.store = store or ImageStore()
        self.run_dir = Path(run_dir or os.environ.get("LEGORL_RUN_DIR", "/run/legorl"))
        self._cgroups: Cgroups | None = None
        self._zygote: _Zygote | None = None
        self._ids = itertools.count()

    def _preflight(self) -> Cgroups:
        if os.geteuid() != 0:
            raise SandboxError("the local sandbox backend needs root (namespaces, mounts, cgroups); use docker instead")
        if self._cgroups is None:
            (self.run_dir / "mnt").mkdir(parents=True, exist_ok=True)
            self._cgroups = Cgroups()
            self._cgroups.sweep()
        return self._cgroups

    def _get_zygote(self) -> _Zygote:
        loop = asyncio.get_running_loop()
        if self._zygote is None or not self._zygote.alive or self._zygote.loop is not loop:
            if self._zygote is not None:
                self._zygote.close()
            self._zygote = _Zygote()
        return self._zygote

    async def ensure_image(self, key: str) -> None:
        """Nothing to make: a sandbox starts from the store's directories themselves."""

    async def start(self, spec: SandboxSpec) -> ChannelSandbox:
        """Start a sandbox from the image `spec.image` (an ImageStore key)."""
        try:
            chain = self.store.chain(spec.image)
        except KeyError as e:
            raise SandboxError(str(e.args[0]) if e.args else str(e)) from e
        aliases = self.store.commit_aliases(spec.image)
        return await self.start_layers(spec, [str(ref.rootfs) for ref in chain], commit_aliases=aliases)

    async def start_layers(
        self,
        spec: SandboxSpec,
        lowers: list[str],
        upper: str | None = None,
        work: str | None = None,
        commit_aliases: dict[str, str] | None = None,
    ) -> ChannelSandbox:
        """Start a sandbox over explicit layer dirs (top first). With `upper`/`work` (host
        dirs on one filesystem) the writable layer is kept on the host: image builds."""
        cgroups = self._preflight()
        for path in [*lowers, *spec.readonly_mounts]:
            if not os.path.exists(path):
                raise SandboxError(f"sandbox layer or mount source {path} does not exist")
        zygote = self._get_zygote()
        sid = f"{os.getpid()}-{next(self._ids)}-{uuid.uuid4().hex[:6]}"
        lim = spec.limits
        try:
            cg = cgroups.create(sid, lim.memory_mb, lim.pids, lim.cpus)
        except OSError as e:
            raise SandboxError(f"cannot create cgroups for sandbox {sid}: {e}") from e
        req = {
            "id": sid,
            "lowers": lowers,
            "upper": upper,
            "work": work,
            "scratch": str(self.run_dir / "mnt"),
            "disk_mb": lim.disk_mb,
            "mounts": sorted(spec.readonly_mounts.items()),
            "cgroups": cg.procs_files,
        }
        host_end, sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = await zygote.spawn(req, sandbox_end)
        except BaseException:
            host_end.close()
            await asyncio.to_thread(cg.remove)
            raise
        finally:
            sandbox_end.close()
        reader, writer = await asyncio.open_connection(sock=host_end, limit=1 << 20)
        channel = InitChannel(reader, writer.write, max_payload=MAX_FILE + 2 * lim.output_bytes + (64 << 20))

        async def cleanup() -> None:
            await channel.close()
            writer.close()
            if not await zygote.wait_exit(sid, 5.0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                await zygote.wait_exit(sid, 5.0)
            zygote.statuses.pop(sid, None)
            await asyncio.to_thread(cg.remove)

        try:
            await channel.ready(START_TIMEOUT_S)
            sandbox = ChannelSandbox(
                sid,
                spec,
                channel,
                netns_path=f"/proc/{pid}/ns/net",
                counters=cg.counters,
                cleanup=cleanup,
                commit_aliases=commit_aliases,
                lost=lambda: zygote.lost_cause(sid),
            )
            await sandbox.set_proxy(spec.proxy_socket)
        except BaseException:
            await cleanup()
            raise
        return sandbox

    async def aclose(self) -> None:
        """Stop the zygote (any sandbox still running dies with it)."""
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
