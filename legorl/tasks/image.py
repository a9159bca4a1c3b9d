"""From a Task to a sandbox image key, and from a backend name to a Backend.

Task images come from the layered cache (`legorl/sandbox/images.py`): base → the task's
repository at `base_commit` with time-safe history. The cache builds task layers from a
git repository directory; tasks may ship their repository as a `git bundle` (small, one
file), so a bundle is first cloned once (without a checkout) into the cache, keyed
by the bundle's content hash (concurrent callers wait on a file lock, never half-read).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from legorl.sandbox.images import ImageRef, ImageStore
from legorl.sandbox.layers import ensure_base, ensure_env, ensure_task
from legorl.tasks.prebuilt import import_image, is_cache_key
from legorl.types import Task

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
        self._keys: dict[tuple[str, str, str], str] = {}
        self._lock = asyncio.Lock()

    async def base(self) -> ImageRef:
        if self._base is None:
            self._base = await ensure_base(self.store)
        return self._base

    async def _prebuilt(self, task: Task) -> str:
        """A Docker image by reference (`prebuilt.py`): imported once with its repository taken
        out, then the task layer on it as for any task (time-safe history)."""
        ident = ("image", task.image, task.base_commit, task.env_setup)
        async with self._lock:
            if ident not in self._keys:
                layer, source = await import_image(self.store, task.image)
                setup = [task.env_setup] if task.env_setup.strip() else []
                ref = await ensure_task(self.store, layer, source, task.base_commit, setup=setup)
                if self.backend == "docker":
                    from legorl.sandbox.docker_images import ensure_docker_image

                    await ensure_docker_image(self.store, ref.key)
                self._keys[ident] = ref.key
            return self._keys[ident]

    async def _harbor(self, task: Task) -> str:
        """A Harbor task: its environment/Dockerfile built over the mapped base (harbor_image.py)."""
        from legorl.tasks.harbor import harbor_spec
        from legorl.tasks.harbor_image import ensure_harbor_image, resolve_base

        ident = ("harbor", task.task_dir, "", "")
        async with self._lock:
            if ident not in self._keys:
                spec = harbor_spec(task)
                target = resolve_base(spec.dockerfile.base)
                parent = await self.base() if target == "base" else self.store.get(target)
                ref = await ensure_harbor_image(self.store, parent, spec)
                if self.backend == "docker":
                    from legorl.sandbox.docker_images import ensure_docker_image

                    await ensure_docker_image(self.store, ref.key)
                self._keys[ident] = ref.key
            return self._keys[ident]

    async def for_task(self, task: Task) -> str:
        """The task image key (built if missing; a Docker image too for the docker backend).

        A task that names a prebuilt `image` (a key of the cache) uses it as it is; one that
        names a Docker image (present locally or a tarball, never pulled) is imported.
        """
        if task.kind == "harbor":
            return await self._harbor(task)
        if task.image and not await asyncio.to_thread(is_cache_key, self.store, task.image):
            return await self._prebuilt(task)
        if task.image:
            if self.backend == "docker":
                from legorl.sandbox.docker_images import ensure_docker_image

                await ensure_docker_image(self.store, task.image)
            return task.image
        ident = (task.repo_path, task.base_commit, task.env_setup, tuple(task.requirements))
        if ident in self._keys:
            return self._keys[ident]
        async with self._lock:
            if ident in self._keys:
                return self._keys[ident]
            base = await self.base()
            if task.requirements:  # wheels its tests need, installed offline (from scripts/setup_swebench.sh's cache)
                from legorl.sandbox.images import EnvSpec
                from legorl.tasks.generator.native import wheels_dir

                if not wheels_dir().is_dir():
                    raise FileNotFoundError(
                        f"task {task.instance_id}: {wheels_dir()} is missing: run scripts/setup_swebench.sh"
                    )
                base = await ensure_env(
                    self.store, base, EnvSpec(pip=tuple(task.requirements), wheel_dirs=(str(wheels_dir()),))
                )
            repo = await asyncio.to_thread(materialize_repo, task.repo_path, self.store.root)
            setup = [task.env_setup] if task.env_setup.strip() else []
            ref = await ensure_task(self.store, base, repo, task.base_commit, setup=setup)
            if self.backend == "docker":
                from legorl.sandbox.docker_images import ensure_docker_image

                await ensure_docker_image(self.store, ref.key)
            self._keys[ident] = ref.key
            return ref.key
