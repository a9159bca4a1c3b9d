"""The image cache: read-only filesystems built in layers, keyed by content, built once.

    store = ImageStore()                                  # $LEGORL_CACHE or ~/.cache/legorl/images
    base = await ensure_base(store)                       # layers.py: debootstrap'd Debian + python3 + git
    env = await ensure_env(store, base, EnvSpec(pip=("requests==2.32.3",), wheel_dirs=(wheels,)))
    task = await ensure_task(store, env, "/src/repo", base_commit, hide_paths=["tests/test_x.py"])
    SandboxSpec(image=task.key)                           # what both backends start from
    await ensure_docker_image(store, task.key)            # same layers as a Docker image

Layers: **base** (a minimal Debian of the host's suite, made by debootstrap, so nothing of
the host is visible inside), **env** (a project's dependencies: pip installs from local
wheel/sdist dirs, offline, plus shell commands), **task** (the repository at its base
commit with time-safe history: a fresh repository with exactly one commit, no remotes,
tags, reflogs or other refs, and `hide_paths` absent from files *and* history). An env or
task layer is the upper directory of an overlay over its parents (whiteouts included), so
the local backend stacks layers directly and the docker backend loads the same files as
Docker layers (docker_images.py).

Each layer lives in `<root>/layers/<key>/` as `rootfs/` plus `meta.json`; its key hashes
its recipe and its parent's key, so a changed input is a new key and an unchanged one is
a cache hit. Builds are atomic (built aside, renamed into place) and serialised per key
across processes (flock). Hits, misses and build times go to `<root>/stats.json`.
A task layer's repository commit differs from the upstream `base_commit` whenever files
are hidden; `ImageStore.commit_aliases` maps one to the other so `Sandbox.diff(base_commit)`
works with the upstream hash.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from legorl.sandbox.base import Limits

log = logging.getLogger(__name__)

KINDS = ("base", "env", "task")
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "python3-pytest", "git", "patch", "procps")
RECIPE_VERSION = 1  # bump when a builder changes what it produces for the same inputs


class ImageNotFound(KeyError):
    """No layer with this key in the cache."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "image not found"


@dataclass(frozen=True)
class ImageRef:
    """One cached layer; `key` is what `SandboxSpec.image` names."""

    key: str
    kind: str
    parent: str | None
    path: Path
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    @property
    def docker_tag(self) -> str:
        return f"legorl/{self.kind}:{self.key}"


@dataclass(frozen=True)
class EnvSpec:
    """A project's dependencies, installed offline into an environment layer."""

    pip: tuple[str, ...] = ()
    """Requirement specifiers for `pip install` (e.g. "requests==2.32.3", "pkg[extra]")."""
    wheel_dirs: tuple[str, ...] = ()
    """Host dirs of wheels/sdists pip installs from (mounted read-only; no index is used)."""
    download: bool = False
    """First `pip download` the `pip` requirements on the host (needs PyPI) into a cache dir."""
    run: tuple[str, ...] = ()
    """Shell commands run (as root, no network) after the pip install."""
    timeout_s: float = 1800.0
    """Limit for the whole build."""
    limits: Limits = field(default_factory=lambda: Limits(memory_mb=4096, pids=2048, cpus=2.0, disk_mb=8192))
    """Resources of the build sandbox."""

    def __post_init__(self) -> None:
        for name in ("pip", "wheel_dirs", "run"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(f"EnvSpec.{name} must be a list of strings, not one string")
            object.__setattr__(self, name, tuple(value))
        for d in self.wheel_dirs:
            if not Path(d).is_dir():
                raise ValueError(f"EnvSpec.wheel_dirs: {d} is not a directory")


def default_root() -> Path:
    return Path(os.environ.get("LEGORL_CACHE") or Path.home() / ".cache" / "legorl" / "images")


def content_key(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:32]


def dir_fingerprint(path: str | Path) -> list[list[Any]]:
    """Names, sizes and mtimes of a dir's files: cheap identity for wheel dirs."""
    out = []
    for p in sorted(Path(path).rglob("*")):
        if p.is_file():
            st = p.stat()
            out.append([str(p.relative_to(path)), st.st_size, st.st_mtime_ns])
    return out


def tree_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


class ImageStore:
    """The layered image cache on disk (see the module docstring)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else default_root()
        self.layers = self.root / "layers"
        self.locks = self.root / "locks"
        self._key_locks: dict[tuple[int, str], asyncio.Lock] = {}

    # -- lookup ---------------------------------------------------------------------------
    def get(self, key: str) -> ImageRef:
        """The layer `key` (a full key or a unique prefix of at least 8 characters)."""
        path = self.layers / key
        if not (path / "meta.json").is_file() and len(key) >= 8 and self.layers.is_dir():
            found = [p for p in self.layers.glob(key + "*") if (p / "meta.json").is_file()]
            if len(found) == 1:
                path = found[0]
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError):
            raise ImageNotFound(
                f"image {key!r} is not in the cache {self.layers} "
                "(build it with `legorl images build` or ImageStore.ensure_*)"
            ) from None
        return ImageRef(meta["key"], meta["kind"], meta.get("parent"), path, meta)

    def chain(self, key: str) -> list[ImageRef]:
        """The layer and all its parents, top first (overlayfs lowerdir order)."""
        refs = [self.get(key)]
        while refs[-1].parent:
            refs.append(self.get(refs[-1].parent))
        return refs

    def commit_aliases(self, key: str) -> dict[str, str]:
        """Upstream base commit -> the commit that stands for it in the image's repository."""
        return {
            r.meta["source_commit"]: r.meta["commit"]
            for r in self.chain(key)
            if r.kind == "task" and "commit" in r.meta
        }

    def ls(self) -> list[ImageRef]:
        if not self.layers.is_dir():
            return []
        refs = []
        for p in self.layers.iterdir():
            if not p.name.startswith(".") and (p / "meta.json").is_file():
                with contextlib.suppress(ImageNotFound, KeyError):
                    refs.append(self.get(p.name))
        return sorted(refs, key=lambda r: (KINDS.index(r.kind), r.meta.get("created", 0)))

    # -- building: callers hand in the recipe and the builder (legorl.sandbox.layers) ------
    async def ensure(
        self, kind: str, parent: str | None, recipe: dict[str, Any], build: Callable[[Path], Awaitable[dict[str, Any]]]
    ) -> ImageRef:
        """The layer whose content key is `recipe`'s; built once by `build(tmp_dir)` (which
        fills `tmp_dir/rootfs` and returns extra metadata) under a per-key lock shared by
        every process on the machine, then renamed into place."""
        key = content_key(recipe)
        lock = self._key_locks.setdefault((id(asyncio.get_running_loop()), key), asyncio.Lock())
        async with lock:
            with contextlib.suppress(ImageNotFound):
                ref = self.get(key)
                self._record(kind, hit=True)
                return ref
            self.layers.mkdir(parents=True, exist_ok=True)
            self.locks.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.locks / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                with contextlib.suppress(ImageNotFound):
                    ref = self.get(key)  # another process built it while we waited
                    self._record(kind, hit=True)
                    return ref
                tmp = self.layers / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
                tmp.mkdir()
                t0 = time.monotonic()
                try:
                    (tmp / "rootfs").mkdir(mode=0o755)
                    extra = await build(tmp)
                    build_s = time.monotonic() - t0
                    meta = {
                        "key": key,
                        "kind": kind,
                        "parent": parent,
                        "recipe": recipe,
                        "created": time.time(),
                        "build_s": round(build_s, 3),
                        "size_bytes": tree_size(tmp / "rootfs"),
                        **extra,
                    }
                    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
                    os.rename(tmp, self.layers / key)
                except BaseException:
                    await asyncio.to_thread(remove_tree, tmp)
                    raise
                self._record(kind, hit=False, build_s=build_s, key=key)
                log.info("built %s layer %s in %.1f s", kind, key, build_s)
                return self.get(key)
            finally:
                os.close(fd)

    # -- bookkeeping ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _stats_locked(self) -> Iterator[dict[str, Any]]:
        self.locks.mkdir(parents=True, exist_ok=True)
        with open(self.locks / "stats.lock", "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            path = self.root / "stats.json"
            try:
                stats = json.loads(path.read_text())
            except (OSError, ValueError):
                stats = {}
            yield stats
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(stats, indent=1))
            os.replace(tmp, path)

    def _record(self, kind: str, hit: bool, build_s: float = 0.0, key: str = "") -> None:
        with self._stats_locked() as st:
            bucket = st.setdefault("hits" if hit else "misses", {})
            bucket[kind] = bucket.get(kind, 0) + 1
            if not hit:
                st.setdefault("build_s", {})[kind] = round(st.get("build_s", {}).get(kind, 0.0) + build_s, 3)
                builds = st.setdefault("builds", [])
                builds.append({"key": key, "kind": kind, "build_s": round(build_s, 3), "at": time.time()})
                del builds[:-200]

    def stats(self) -> dict[str, Any]:
        """{hits: {kind: n}, misses: {kind: n}, build_s: {kind: total}, builds: [...]}."""
        try:
            return json.loads((self.root / "stats.json").read_text())
        except (OSError, ValueError):
            return {}

    def prune(
        self,
        keys: list[str] | None = None,
        older_than_s: float | None = None,
        kinds: tuple[str, ...] = KINDS,
        on_removed: Callable[[list[ImageRef]], None] | None = None,
    ) -> list[str]:
        """Remove layers (and every layer built on them); returns the removed keys.

        With `keys`, those layers; else every layer of `kinds` created more than
        `older_than_s` ago (all of them when it is None). `on_removed` gets the removed
        layers (e.g. `docker_images.remove_docker_images`, which deletes their Docker
        images: the store itself knows nothing of Docker)."""
        refs = self.ls()
        if keys is not None:
            doomed = {self.get(k).key for k in keys}
        else:
            now = time.time()
            doomed = {
                r.key
                for r in refs
                if r.kind in kinds and (older_than_s is None or now - r.meta.get("created", 0) > older_than_s)
            }
        changed = True
        while changed:  # children of a removed layer cannot start any more
            changed = False
            for r in refs:
                if r.parent in doomed and r.key not in doomed:
                    doomed.add(r.key)
                    changed = True
        for r in refs:
            if r.key in doomed:
                remove_tree(r.path)
        if on_removed is not None:
            on_removed([r for r in refs if r.key in doomed])
        for junk in self.layers.glob(".tmp-*") if self.layers.is_dir() else []:
            if time.time() - junk.stat().st_mtime > 3600:
                remove_tree(junk)
        return sorted(doomed)


def remove_tree(path: Path) -> None:
    """rm -rf that also handles read-only dirs and symlinked layers."""
    if path.is_symlink():
        path.unlink()
        return

    def onerror(func: Callable[..., Any], p: str, exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, 0o755)
            func(p)

    shutil.rmtree(path, onerror=onerror)
