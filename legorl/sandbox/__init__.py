"""Sandboxes: throw-away, isolated copies of cached images with a process tree inside.

Start here:

    from legorl.sandbox import ImageStore, SandboxSpec, Limits, open_backend
    from legorl.sandbox.layers import ensure_base, ensure_task

    store = ImageStore()                                   # layered image cache (images.py)
    base = await ensure_base(store)
    task_img = await ensure_task(store, base, repo_path, base_commit, hide_paths=[...])
    async with open_backend("local", store) as backend:   # or "docker"; pool.py for warm starts
        async with await backend.start(SandboxSpec(image=task_img.key, proxy_socket=sock)) as sb:
            res = await sb.exec("pytest -q", timeout_s=300)  # ExecResult (base.py)
            sb.proxy_url                                     # "http://127.0.0.1:8000" inside
            patch = await sb.diff(base_commit)

Modules: base.py (protocol + dataclasses), images.py / layers.py / docker_images.py (the
image cache), local.py and docker.py (backends), channel.py (the host side shared by both),
forwarder.py (loopback -> proxy socket), cgroups.py (limits), pool.py (warm starts,
retries), cli.py (`legorl images ...`).

Where code runs: `in_sandbox/` holds the programs that run in another interpreter, inside a
sandbox: init.py (pid 1 of every sandbox), zygote.py (the local backend's forking zygote),
linux.py (its ctypes wrappers) and seccomp.py (the syscall filter). They use the standard
library only and are read as files (sent down a pipe, started by path), never imported by
the host; nothing outside `in_sandbox/` runs anywhere but the host. The same rule holds in
every package (`legorl/harness/in_sandbox/`, `legorl/harness/in_driver/`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from legorl.sandbox.base import Backend, DiffError, ExecResult, Limits, Sandbox, SandboxError, SandboxSpec
from legorl.sandbox.images import EnvSpec, ImageNotFound, ImageRef, ImageStore

if TYPE_CHECKING:
    from legorl.sandbox.docker import DockerBackend
    from legorl.sandbox.local import LocalBackend

BACKENDS = ("local", "docker")


def open_backend(name: str, store: ImageStore | None = None) -> LocalBackend | DockerBackend:
    """The one sandbox backend factory (production, tests, bench): "local" (namespaces +
    overlayfs) or "docker". Both start `ChannelSandbox`es and are closed by `async with`
    or `aclose()`. The backend modules are imported only when chosen (Docker's needs
    its client libraries, local's the Linux namespace helpers)."""
    if name == "local":
        from legorl.sandbox.local import LocalBackend

        return LocalBackend(store)
    if name == "docker":
        try:
            from legorl.sandbox.docker import DockerBackend
        except ImportError as exc:
            raise SandboxError(f"the docker backend is not available: {exc}") from None
        return DockerBackend(store)
    raise ValueError(f"unknown sandbox backend {name!r}: expected one of {', '.join(BACKENDS)}")


__all__ = [
    "BACKENDS",
    "Backend",
    "DiffError",
    "EnvSpec",
    "ExecResult",
    "ImageNotFound",
    "ImageRef",
    "ImageStore",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "open_backend",
]
