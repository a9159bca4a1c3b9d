"""Sandboxes: throw-away, isolated copies of cached images with a process tree inside.

Start here:

    from legorl.sandbox import ImageStore, SandboxSpec, Limits, make_backend

    store = ImageStore()                                   # layered image cache (images.py)
    base = await store.ensure_base()
    task_img = await store.ensure_task(base, repo_path, base_commit, hide_paths=[...])
    backend = make_backend("local", store)                 # or "docker"; pool.py for warm starts
    async with await backend.start(SandboxSpec(image=task_img.key, proxy_socket=sock)) as sb:
        res = await sb.exec("pytest -q", timeout_s=300)    # ExecResult (base.py)
        sb.proxy_url                                       # "http://127.0.0.1:8000" inside
        patch = await sb.diff(base_commit)
    await backend.aclose()

Modules: base.py (protocol + dataclasses), images.py / layers.py / docker_images.py (the
image cache), local.py and docker.py (backends), channel.py (the host side shared by both),
_init.py (pid 1 inside every sandbox), _zygote.py, _linux.py and _seccomp.py (namespaces
and syscall filter for `local`), forwarder.py (loopback -> proxy socket), cgroups.py
(limits), pool.py (warm starts, retries), cli.py (`legorl images ...`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from legorl.sandbox.base import Backend, DiffError, ExecResult, Limits, Sandbox, SandboxError, SandboxSpec
from legorl.sandbox.images import EnvSpec, ImageNotFound, ImageRef, ImageStore

if TYPE_CHECKING:
    from legorl.sandbox.docker import DockerBackend
    from legorl.sandbox.local import LocalBackend

BACKENDS = {"local": "legorl.sandbox.local:LocalBackend", "docker": "legorl.sandbox.docker:DockerBackend"}


def make_backend(name: str, store: ImageStore | None = None) -> LocalBackend | DockerBackend:
    """The backend called `name` ("local" or "docker"); both have `start(spec)`/`aclose()`
    and return `ChannelSandbox`es (exec, read_file, write_file, diff, close, proxy_url)."""
    import importlib

    if name not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {name!r}: expected one of {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)(store)


__all__ = [
    "BACKENDS", "Backend", "DiffError", "EnvSpec", "ExecResult", "ImageNotFound", "ImageRef", "ImageStore",
    "Limits", "Sandbox", "SandboxError", "SandboxSpec", "make_backend",
]
