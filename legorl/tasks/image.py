"""From a Task to a sandbox image key.

Task images come from the layered cache (`legorl/sandbox/images.py`); which layers a task's
image is made of is its kind's to say (`tasks/kinds/`: a SWE-bench row's repository at
`base_commit` with time-safe history, a Harbor task's Dockerfile), and `TaskImages` gives
the kinds what they share: the base, one build per image per process, and the image made
startable by the sandbox backend (`Backend.ensure_image`: Docker loads it as an image).
The cache builds task layers from a git repository directory; tasks may ship their
repository as a `git bundle` (small, one file), so a bundle is first cloned once (without a
checkout) into the cache, keyed by the bundle's content hash (concurrent callers wait on a
file lock, never half-read): `materialize_repo`.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from legorl.sandbox import open_backend
from legorl.sandbox.base import Backend
from legorl.sandbox.images import ImageRef, ImageStore
from legorl.sandbox.layers import ensure_base
from legorl.tasks.kinds import kind_of
from legorl.types import Task

if TYPE_CHECKING:
    from legorl.tasks.kinds.base import TaskKind

BACKENDS = ("local", "docker")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def materialize_repo(repo_path: str | Path, cache_root: Path) -> Path:
    """A git repository for `repo_path`: itself, or a clone of a bundle (cached; not checked
    out: the image builder reads commits from it, never its work tree)."""
    src = Path(repo_path)
    if src.is_dir():
        return src
    if not src.is_file():
        raise FileNotFoundError(f"task repository {src} does not exist")
    dest = cache_root / "repos" / _sha256_file(src)[:32]
    if (dest / ".git" / "legorl-complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f"{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".git" / "legorl-complete").exists():
            return dest
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        proc = subprocess.run(
            ["git", "clone", "-q", "--no-checkout", str(src), str(tmp)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ValueError(f"{src} is not a usable git bundle: {proc.stderr.strip()[-500:]}")
        (tmp / ".git" / "legorl-complete").write_text(str(src) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    return dest


class TaskImages:
    """Image keys for tasks, built on demand and cached (memoised per process too)."""

    def __init__(self, backend: str = "local", store: ImageStore | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.store = store or ImageStore()
        self._base: ImageRef | None = None
        self._keys: dict[tuple[object, ...], str] = {}
        self._lock = asyncio.Lock()
        self._sandboxes: Backend | None = None  # made on first use: only its `ensure_image` is called

    async def base(self) -> ImageRef:
        if self._base is None:
            self._base = await ensure_base(self.store)
        return self._base

    async def ready(self, key: str) -> str:
        """`key`, made startable by the backend (a Docker image too for the docker backend)."""
        if self._sandboxes is None:
            self._sandboxes = open_backend(self.backend, self.store)
        await self._sandboxes.ensure_image(key)
        return key

    async def built(self, ident: tuple[object, ...], build: Callable[[], Awaitable[str]]) -> str:
        """The key `build()` makes for `ident`, built and made ready once per process
        (concurrent callers wait for the first)."""
        if ident in self._keys:
            return self._keys[ident]
        async with self._lock:
            if ident not in self._keys:
                self._keys[ident] = await self.ready(await build())
            return self._keys[ident]

    async def for_task(self, task: Task, kind: TaskKind | None = None) -> str:
        """The task image key (built if missing; made startable by the backend), as the
        task's kind (`kind`, else chosen here) builds it. A task that names a prebuilt `image`
        (a key of the cache) uses it as it is; one that names a Docker image (present locally
        or a tarball, never pulled) is imported."""
        return await (kind or kind_of(task)).image(self)
