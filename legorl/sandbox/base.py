"""The Sandbox protocol: one isolated, throw-away copy of an image with a process tree.

Both backends (`local`: namespaces + overlayfs; `docker`) implement it and pass the same
contract tests. A sandbox is an async context manager so it is always cleaned up, also
when the code using it crashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ExecResult:
    """What one command did inside a sandbox."""

    exit_code: int  # -9 etc. for a signal; 124 when our timeout killed it
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # output was cut at the limit
    duration_s: float = 0.0
    # Resource limits the command ran into (all agent-caused; see sandbox/channel.py):
    oom_killed: bool = False  # the kernel's OOM killer killed a process of the sandbox
    pids_limited: bool = False  # a fork failed at the sandbox's pids limit
    disk_full: bool = False  # the sandbox's disk quota is (nearly) exhausted

    @property
    def resource_exhausted(self) -> bool:
        """True when the sandbox hit one of its limits while this command ran."""
        return self.oom_killed or self.pids_limited or self.disk_full


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox (cgroups where available)."""

    memory_mb: int = 2048
    pids: int = 512
    cpus: float = 1.0
    disk_mb: int = 2048
    output_bytes: int = 1_000_000


@dataclass(frozen=True)
class SandboxSpec:
    """How to start a sandbox: from which image, with what limits and environment."""

    image: str  # image key (see sandbox/images.py)
    limits: Limits = field(default_factory=Limits)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/repo"
    proxy_socket: str | None = None  # host unix socket of this sandbox's proxy session
    proxy_port: int = 8000  # loopback port inside the sandbox that forwards to proxy_socket
    readonly_mounts: dict[str, str] = field(default_factory=dict)  # host path -> sandbox path


class SandboxError(RuntimeError):
    """An infrastructure fault of a sandbox (start failed, backend gone): never the agent's."""


class SandboxLost(SandboxError):
    """The sandbox was taken down from outside — its init killed by a signal nothing inside
    can send (a PID namespace's init ignores SIGKILL from its own namespace), or its
    backend died — not by the code in it and not by its own limits: infrastructure.
    `cause` names it (`killed_by_signal_9`, `backend_died`) and becomes a flag."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class DiffError(RuntimeError):
    """The agent's repository yields no diff (base commit gone, .git broken, diff too large):
    agent-caused, unlike SandboxError."""


class Sandbox(Protocol):
    """One running sandbox."""

    id: str

    async def exec(
        self, cmd: str, timeout_s: float = 60.0, cwd: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def diff(self, base_commit: str) -> str:
        """The agent's changes as a git diff against `base_commit` (tracked and new files)."""
        ...

    async def close(self) -> None: ...

    async def lost_cause(self) -> str | None:
        """After a SandboxError: why the sandbox died when it was not its own doing
        (`SandboxLost.cause` values), else None (alive, exited by itself, or out of its memory)."""
        ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


class Backend(Protocol):
    """Starts sandboxes of one kind. Made by `legorl.sandbox.open_backend`; one lifecycle:
    `async with open_backend(...) as backend:` (or `aclose()` by an owner that outlives a
    block, like a rollout worker)."""

    name: str

    async def start(self, spec: SandboxSpec) -> Sandbox: ...

    async def ensure_image(self, key: str) -> None:
        """Make the cached image `key` startable by this backend, ahead of `start`: Docker
        loads its layers as a Docker image (once); the local backend starts from the store's
        directories as they are. A failure here is the image's, not a sandbox's."""
        ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Backend: ...

    async def __aexit__(self, *exc: object) -> None: ...


class BackendLifecycle:
    """`async with` for a backend: the block's end is `aclose()` (both backends inherit it)."""

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> BackendLifecycle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
