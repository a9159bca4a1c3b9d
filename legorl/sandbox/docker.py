"""The `docker` backend: the same sandboxes on a real Docker engine.

    backend = DockerBackend(ImageStore())
    async with await backend.start(SandboxSpec(image=task_ref.key)) as sb:
        await sb.exec("pytest -x")

Each sandbox is one container, created through the Engine API on the local socket with
`--network none`, `--memory` (= memory+swap), `--pids-limit`, `--cpus`, no-new-privileges
and read-only binds for `readonly_mounts`. The disk quota is the local backend's: the init
first moves into an overlay of the image whose writable layer is a tmpfs of `disk_mb`
(storage-driver quotas need XFS project quotas or btrfs qgroups; the first is missing from
some kernels, the second made create/delete take tens of seconds under load). Its
command is the same init as the local backend's (`in_sandbox/init.py`, run by the image's python3),
attached over stdin/stdout, so exec/timeouts/files/diff behave identically and each exec is
one message, not a `docker exec` round-trip. The proxy forwarder listens inside the
container's network namespace, opened from the host (forwarder.py). `StdinOnce` makes the
container exit when this process goes away, crash or not; the next backend of this host
removes what such a process left (`_sweep`).

Faults by cause, as on the local backend: when the init's channel breaks, the container is
inspected before it is removed (hence no `AutoRemove`: an external kill would race with
Docker deleting the evidence). Gone from the engine → `container_removed`; exited on a
signal (ExitCode 128+N, and `State.OOMKilled` false) → `killed_by_signal_N`, which nothing
inside can send to a PID namespace's init; `OOMKilled` (the container's own memory limit:
with cgroup v1 Docker learns it from the memory cgroup's OOM notifier, which a host-wide
OOM does not fire) → the agent's; the engine not answering → `backend_died`.

Syscalls: Docker applies its default seccomp profile, but derives it from the capabilities,
and the CAP_SYS_ADMIN the init needs for the quota's tmpfs makes it allow unshare, setns,
mount, clone3 and clone(CLONE_NEW*), i.e. nested user namespaces. So the init also installs
the local backend's filter (`in_sandbox/seccomp.py`, whose source the host sends down stdin right after
the init's), once it has dropped CAP_SYS_ADMIN and before it serves a command; the start
fails if it cannot. Both filters apply; the stricter verdict wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
import uuid
from pathlib import Path
from typing import Any

import httpx

from legorl.sandbox.base import BackendLifecycle, SandboxError, SandboxSpec
from legorl.sandbox.cgroups import counters_for_pid
from legorl.sandbox.channel import MAX_FILE, ChannelSandbox, InitChannel
from legorl.sandbox.docker_images import ensure_docker_image
from legorl.sandbox.images import ImageStore

log = logging.getLogger(__name__)

IN_SANDBOX = Path(__file__).parent / "in_sandbox"  # programs the sandbox runs: read as files, never imported
INIT_SRC = (IN_SANDBOX / "init.py").read_bytes()
SECCOMP_SRC = (IN_SANDBOX / "seccomp.py").read_bytes()
# The container's command only reads the init's source from stdin (10-digit length, then
# the bytes) and runs it: the source is not repeated in every sandbox's /proc/1/cmdline.
# The init then reads the seccomp filter's source, framed the same way, from the same stdin.
BOOT = (
    "import os\nh=b''\nwhile len(h)<10:\n h+=os.read(0,10-len(h))\nn=int(h)\nb=b''\n"
    "while len(b)<n:\n b+=os.read(0,n-len(b))\nexec(compile(b,'legorl-init','exec'))"
)
DEFAULT_SOCKET = "/var/run/docker.sock"
START_TIMEOUT_S = 60.0


class DockerBackend(BackendLifecycle):
    """Starts sandboxes as Docker containers (`async with`, or `aclose()` when done)."""

    name = "docker"

    def __init__(self, store: ImageStore | None = None, socket_path: str | None = None) -> None:
        self.store = store or ImageStore()
        host = os.environ.get("DOCKER_HOST", "")  # the docker CLI's variable: both must reach one engine
        cli_socket = host.removeprefix("unix://") if host.startswith("unix://") else None
        self.socket_path = socket_path or os.environ.get("DOCKER_SOCKET") or cli_socket or DEFAULT_SOCKET
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._api = ""
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        # Each container a top-level CPU group, as the local backend does: under the shared
        # "docker" parent, all containers together would weigh one process.
        self.cgroup_parent = "/"

    async def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            if not os.path.exists(self.socket_path):
                raise SandboxError(f"no Docker engine at {self.socket_path} (run scripts/setup_sandbox.sh)")
            self._client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=self.socket_path), base_url="http://docker", timeout=120
            )
            self._loop = loop
            try:
                version = (await self._client.get("/version")).json()
            except httpx.HTTPError as e:
                raise SandboxError(f"Docker engine at {self.socket_path} does not answer: {e}") from e
            self._api = "/v" + str(version.get("ApiVersion", "1.41"))
            await self._sweep()
        return self._client

    async def _call(self, method: str, path: str, ok: tuple[int, ...] = (200, 201, 204), **kw: Any) -> httpx.Response:
        client = await self._http()
        try:
            resp = await client.request(method, self._api + path, **kw)
        except httpx.HTTPError as e:
            raise SandboxError(f"docker {method} {path}: {e}") from e
        if resp.status_code not in ok:
            try:
                msg = resp.json().get("message", resp.text)
            except ValueError:
                msg = resp.text
            raise SandboxError(f"docker {method} {path}: {resp.status_code} {msg}")
        return resp

    async def _sweep(self) -> None:
        """Remove containers of sandbox owners (processes on this host) that are gone."""
        host = socket.gethostname()
        resp = await self._call("GET", "/containers/json", params={"all": "1", "filters": '{"label":["legorl.owner"]}'})
        for c in resp.json():
            owner = c.get("Labels", {}).get("legorl.owner", "")
            name, _, pid = owner.rpartition(":")
            # Only a gone owner's: a live one inspects its exited containers before removing them.
            if name == host and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(SandboxError):
                    await self._call("DELETE", f"/containers/{c['Id']}", ok=(204, 404, 409), params={"force": "1"})

    def _create_body(self, spec: SandboxSpec, tag: str, sid: str) -> dict[str, Any]:
        lim = spec.limits
        binds = sorted(spec.readonly_mounts.items())
        # The init mounts a tmpfs of disk_mb as the writable layer (see init.py, enter_private_root):
        # it needs CAP_SYS_ADMIN for that and drops it before any command runs.
        # A file is bound through its directory (at a staging path the sandbox cannot reach
        # once it has switched roots), so that the init can re-mount it naming no host path.
        keep: list[Any] = []
        docker_binds: list[str] = []
        for i, (h, t) in enumerate(binds):
            if os.path.isdir(h):
                keep.append(t)
                docker_binds.append(f"{h}:{t}:ro")
            else:
                keep.append([t, f"/.legorl-ro/{i}/{os.path.basename(h)}"])
                docker_binds.append(f"{os.path.dirname(os.path.abspath(h))}:/.legorl-ro/{i}:ro")
        config = {"disk_mb": lim.disk_mb, "keep": keep}
        host: dict[str, Any] = {
            "NetworkMode": "none",
            "Memory": lim.memory_mb << 20,
            "MemorySwap": lim.memory_mb << 20,
            "PidsLimit": lim.pids,
            "NanoCpus": int(lim.cpus * 1e9),
            "Binds": docker_binds,
            "CapAdd": ["SYS_ADMIN"],
            "SecurityOpt": ["no-new-privileges"],
            "IpcMode": "private",
            "CgroupParent": self.cgroup_parent,
            "ShmSize": 64 << 20,
        }
        return {
            "Image": tag,
            "Cmd": ["/usr/bin/python3", "-I", "-S", "-c", BOOT],
            "Hostname": "sandbox",
            "WorkingDir": "/",
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LEGORL_INIT_CONFIG=" + json.dumps(config),
            ],
            "OpenStdin": True,
            "StdinOnce": True,
            "AttachStdin": True,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "NetworkDisabled": True,
            "Labels": {"legorl.sandbox": sid, "legorl.owner": self.owner},
            "HostConfig": host,
        }

    async def _create(self, spec: SandboxSpec, tag: str, sid: str) -> str:
        resp = await self._call("POST", "/containers/create", json=self._create_body(spec, tag, sid))
        return str(resp.json()["Id"])

    async def ensure_image(self, key: str) -> None:
        """The cached image `key` and its parents as Docker images (made once, `docker_images.py`)."""
        await ensure_docker_image(self.store, key)

    async def start(self, spec: SandboxSpec) -> ChannelSandbox:
        """Start a sandbox from the image `spec.image` (an ImageStore key)."""
        for path in spec.readonly_mounts:
            if not os.path.exists(path):
                raise SandboxError(f"sandbox mount source {path} does not exist")
        try:
            tag = await ensure_docker_image(self.store, spec.image)
            aliases = self.store.commit_aliases(spec.image)
        except KeyError as e:
            raise SandboxError(str(e)) from e
        sid = uuid.uuid4().hex[:12]
        cid = await self._create(spec, tag, sid)
        stream: _AttachStream | None = None
        channel: InitChannel | None = None

        async def cleanup() -> None:
            # Kill and remove: its processes are gone when this returns (fast on overlay2).
            if channel is not None:
                await channel.close()
            if stream is not None:
                stream.close()
            with contextlib.suppress(SandboxError):
                await self._call("DELETE", f"/containers/{cid}", ok=(204, 404, 409), params={"force": "1"})

        try:
            stream = await _AttachStream.open(self.socket_path, self._api, cid)
            stream.write(b"%010d" % len(INIT_SRC) + INIT_SRC + b"%010d" % len(SECCOMP_SRC) + SECCOMP_SRC)
            await self._call("POST", f"/containers/{cid}/start")
            pid = int((await self._call("GET", f"/containers/{cid}/json")).json()["State"]["Pid"])
            channel = InitChannel(
                stream.stdout, stream.write, max_payload=MAX_FILE + 2 * spec.limits.output_bytes + (64 << 20)
            )
            try:
                await channel.ready(START_TIMEOUT_S)
            except SandboxError as e:
                raise SandboxError(f"{e}; container said: {stream.stderr_tail()}") from e
            sandbox = ChannelSandbox(
                sid,
                spec,
                channel,
                netns_path=f"/proc/{pid}/ns/net",
                counters=lambda: counters_for_pid(pid),
                cleanup=cleanup,
                commit_aliases=aliases,
                lost=lambda: self._lost_cause(cid),
            )
            await sandbox.set_proxy(spec.proxy_socket)
        except BaseException:
            await cleanup()
            raise
        return sandbox

    async def _lost_cause(self, cid: str, wait_s: float = 5.0) -> str | None:
        """Why container `cid` died when nothing in it did it (see the module docstring),
        else None (still running, exited by itself, or out of its own memory)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                resp = await self._call("GET", f"/containers/{cid}/json", ok=(200, 404))
            except SandboxError:
                return "backend_died"
            if resp.status_code == 404:
                return "container_removed"
            state = resp.json().get("State", {})
            if not state.get("Running") or loop.time() > deadline:
                break
            await asyncio.sleep(0.05)  # the channel broke a moment before the engine saw the exit
        if state.get("Running") or state.get("OOMKilled"):
            return None
        code = int(state.get("ExitCode") or 0)
        return f"killed_by_signal_{code - 128}" if 128 < code < 128 + 65 else None

    async def aclose(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None


class _AttachStream:
    """A hijacked `attach` connection: raw stdin out, multiplexed stdout/stderr in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self.stdout = asyncio.StreamReader(limit=1 << 20)
        self._stderr = bytearray()
        self._task = asyncio.create_task(self._demux())

    @classmethod
    async def open(cls, socket_path: str, api: str, cid: str) -> _AttachStream:
        reader, writer = await asyncio.open_unix_connection(socket_path, limit=1 << 20)
        writer.write(
            f"POST {api}/containers/{cid}/attach?stream=1&stdin=1&stdout=1&stderr=1 HTTP/1.1\r\n"
            "Host: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n".encode()
        )
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 30)
        if b" 101 " not in status and b" 200 " not in status:
            writer.close()
            raise SandboxError(f"docker attach failed: {status.decode(errors='replace').strip()}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        return cls(reader, writer)

    async def _demux(self) -> None:
        try:
            while True:
                head = await self._reader.readexactly(8)
                kind, size = head[0], struct.unpack(">I", head[4:])[0]
                data = await self._reader.readexactly(size)
                if kind == 1:
                    self.stdout.feed_data(data)
                else:
                    self._stderr += data
                    del self._stderr[:-8192]
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.stdout.feed_eof()

    def stderr_tail(self) -> str:
        return self._stderr.decode(errors="replace").strip()[-2000:] or "(nothing)"

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    def close(self) -> None:
        self._task.cancel()
        self._writer.close()
