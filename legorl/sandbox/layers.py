"""The three image layers: `ensure_base(store)`, `ensure_env(store, base, spec)`,
`ensure_task(store, env, repo, commit)` give each layer's recipe (its content key) and builder
to the `ImageStore`, which caches what the builder produced.

`build_base` runs debootstrap (minutes, once per machine: downloaded .debs are kept in the
cache too); `build_env` and `build_task` run their commands inside a local sandbox whose
writable overlay layer is the new layer's directory, so what they produce is exactly a
layer diff, whiteouts included, with no network (pip installs from mounted wheel dirs).
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from legorl.sandbox.base import Limits, SandboxSpec
from legorl.sandbox.images import (
    BASE_PACKAGES,
    RECIPE_VERSION,
    EnvSpec,
    ImageRef,
    ImageStore,
    dir_fingerprint,
    remove_tree,
)
from legorl.sandbox.local import LocalBackend

log = logging.getLogger(__name__)

DEFAULT_MIRROR = "http://deb.debian.org/debian"
WHEELS_AT = "/legorl-build/wheels"
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n"
GITCONFIG = "[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n"


class ImageBuildError(RuntimeError):
    """A layer could not be built; the message carries the failing step's output."""


def host_suite() -> str:
    """The Debian suite of this machine (bookworm, trixie, ...); bookworm if unknown."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return "bookworm"
    m = re.search(r"^VERSION_CODENAME=\"?([a-z]+)", text, re.M)
    return m.group(1) if m and "debian" in text.lower() else "bookworm"


def host_mirror() -> str:
    """The Debian archive this machine's apt uses (sources.list or deb822 .sources)."""
    uris: list[str] = []
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*"))]:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        uris += re.findall(r"^URIs:\s*(\S+)", text, re.M)
        uris += re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M)
    for uri in uris:
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    return DEFAULT_MIRROR


def _run(cmd: list[str], what: str, timeout_s: float, log_path: Path | None = None, **kw: Any) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, **kw)
    except FileNotFoundError as e:
        raise ImageBuildError(f"{what}: {cmd[0]} is not installed (run scripts/setup_sandbox.sh)") from e
    except subprocess.TimeoutExpired as e:
        raise ImageBuildError(f"{what}: timed out after {timeout_s:.0f} s") from e
    if log_path is not None:
        log_path.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip()[-3000:]
        raise ImageBuildError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def build_base(dest: Path, suite: str, mirror: str | None, packages: tuple[str, ...], debs: Path) -> dict[str, Any]:
    """debootstrap a minimal Debian into dest/rootfs and make it fit for sandboxes."""
    if os.geteuid() != 0:
        raise ImageBuildError("building the base image needs root (debootstrap)")
    mirror = mirror or host_mirror()
    debs.mkdir(parents=True, exist_ok=True)
    rootfs = dest / "rootfs"
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--cache-dir={debs}",
        "--include=" + ",".join(packages),
        suite,
        str(rootfs),
        mirror,
    ]
    log.info("building the base image: %s", " ".join(cmd))
    _run(cmd, "debootstrap", 3600, log_path=dest / "build.log")
    # Nothing of the host may stay in the image: debootstrap copies resolv.conf/hostname.
    (rootfs / "etc/hosts").write_text(HOSTS)
    (rootfs / "etc/hostname").write_text("sandbox\n")
    (rootfs / "etc/resolv.conf").unlink(missing_ok=True)
    (rootfs / "etc/resolv.conf").write_text("")
    (rootfs / "etc/gitconfig").write_text(GITCONFIG)
    # Like the official python images: pip may install into the system (no network anyway).
    for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for junk in [
        *rootfs.glob("var/cache/apt/*.bin"),
        *rootfs.glob("var/lib/apt/lists/*_*"),
        *rootfs.glob("var/cache/apt/archives/*.deb"),
    ]:
        junk.unlink()
    py = _run(
        ["chroot", str(rootfs), "python3", "-c", "import sys; print(sys.version.split()[0])"], "python3 check", 60
    )
    return {"suite": suite, "mirror": mirror, "packages": list(packages), "python": py.strip()}


async def _build_in_sandbox(
    store: ImageStore,
    parent: ImageRef,
    dest: Path,
    mounts: dict[str, str],
    limits: Limits,
    steps: list[tuple[str, str, str]],
    timeout_s: float,
    files: dict[str, bytes] | None = None,
) -> None:
    """Run `steps` (what, cwd, command) in a sandbox whose upper dir is dest/rootfs."""
    work = dest / "work"
    work.mkdir()
    backend = LocalBackend(store)
    try:
        spec = SandboxSpec(image=parent.key, limits=limits, readonly_mounts=mounts, workdir="/")
        lowers = [str(r.rootfs) for r in store.chain(parent.key)]
        async with await backend.start_layers(spec, lowers, upper=str(dest / "rootfs"), work=str(work)) as sb:
            for path, data in (files or {}).items():
                await sb.write_file(path, data)
            for what, cwd, cmd in steps:
                res = await sb.exec(cmd, timeout_s=timeout_s, cwd=cwd, output_limit=4 << 20)
                with (dest / "build.log").open("a") as f:
                    f.write(f"$ {cmd}\n{res.stdout}{res.stderr}\n")
                if res.exit_code != 0:
                    why = "timed out" if res.timed_out else f"exit {res.exit_code}"
                    tail = (res.stdout + res.stderr).strip()[-3000:]
                    raise ImageBuildError(f"{what} failed ({why}): {cmd}\n{tail}")
            await sb.exec("rm -rf /root/.cache /tmp/* /tmp/.[!.]* /var/tmp/* 2>/dev/null; true", cwd="/")
    finally:
        await backend.aclose()
    remove_tree(work)
    mount_points = dest / "rootfs" / WHEELS_AT.strip("/").split("/")[0]
    if mount_points.exists():
        remove_tree(mount_points)  # the (empty) mount points of the wheel dirs


def pip_download(store: ImageStore, reqs: tuple[str, ...]) -> str:
    """`pip download` requirements on the host (PyPI) into a cache dir; returns the dir."""
    out = store.root / "wheels" / hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:24]
    if (out / ".complete").exists():
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "-d", str(out), *reqs], "pip download", 1800)
    (out / ".complete").write_text("")
    return str(out)


async def build_env(store: ImageStore, parent: ImageRef, dest: Path, spec: EnvSpec) -> dict[str, Any]:
    wheel_dirs = list(spec.wheel_dirs)
    if spec.download and spec.pip:
        import asyncio

        wheel_dirs.append(await asyncio.to_thread(pip_download, store, spec.pip))
    mounts = {str(Path(d).resolve()): f"{WHEELS_AT}/{i}" for i, d in enumerate(wheel_dirs)}
    steps = []
    files = {}
    if spec.pip:
        files["/tmp/legorl-requirements.txt"] = ("\n".join(spec.pip) + "\n").encode()
        links = " ".join(f"--find-links {WHEELS_AT}/{i}" for i in range(len(wheel_dirs)))
        steps.append(
            (
                "pip install",
                "/",
                f"python3 -m pip install --no-index --no-cache-dir {links} -r /tmp/legorl-requirements.txt",
            )
        )
    steps += [("env command", "/", c) for c in spec.run]
    await _build_in_sandbox(store, parent, dest, mounts, spec.limits, steps, spec.timeout_s, files)
    return {"pip": list(spec.pip), "run": list(spec.run)}


def _git(repo: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 600) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return _run(
        ["git", "-c", "safe.directory=*", "-C", str(repo), *args],
        f"git {args[0]}",
        timeout_s,
        env={**clean, **(env or {})},
    )


def resolve_commit(repo: Path, rev: str) -> tuple[str, str]:
    """(commit sha, tree sha) of `rev` in `repo`; ValueError naming both if it is not one."""
    try:
        commit = _git(repo, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}").strip()
        tree = _git(repo, "rev-parse", "--verify", "-q", f"{rev}^{{tree}}").strip()
    except ImageBuildError as e:
        raise ValueError(f"{rev!r} is not a commit of the repository {repo}") from e
    return commit, tree


def _safe_rel(path: str) -> str:
    rel = os.path.normpath(path.lstrip("/"))
    if rel.startswith("..") or rel in ("", "."):
        raise ValueError(f"hide_paths: {path!r} is not a path inside the repository")
    return rel


async def build_task(
    store: ImageStore,
    parent: ImageRef,
    dest: Path,
    source: Path,
    commit: str,
    hide: list[str],
    repo_dir: str,
    setup: list[str],
    setup_timeout_s: float,
) -> dict[str, Any]:
    """The repository at `commit` with `hide` removed, as a fresh one-commit repository."""
    repo = dest / "rootfs" / repo_dir.strip("/")
    repo.mkdir(parents=True)
    index = dest / "source.index"
    env = {"GIT_INDEX_FILE": str(index)}
    _git(source, "read-tree", commit, env=env)
    _git(source, "checkout-index", "-a", "-f", f"--prefix={repo}/", env=env)
    index.unlink()
    hidden = []
    for h in hide:
        p = repo / _safe_rel(h)
        if p.is_symlink() or p.is_file():
            p.unlink()
            hidden.append(h)
        elif p.is_dir():
            shutil.rmtree(p)
            hidden.append(h)
    fmt = "%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd%x00%B"
    an, ae, ad, cn, ce, cd, msg = _git(source, "log", "-1", "--date=raw", f"--format={fmt}", commit).split("\x00", 6)
    ident = {
        "GIT_AUTHOR_NAME": an,
        "GIT_AUTHOR_EMAIL": ae,
        "GIT_AUTHOR_DATE": ad,
        "GIT_COMMITTER_NAME": cn,
        "GIT_COMMITTER_EMAIL": ce,
        "GIT_COMMITTER_DATE": cd,
    }
    _git(repo, "init", "-q", "--template=", "-b", "main")
    _git(repo, "add", "-A", "-f", ".")
    _git(
        repo,
        "-c",
        "commit.gpgsign=false",
        "commit",
        "-q",
        "--no-verify",
        "--allow-empty",
        "-m",
        msg.strip() or "base",
        env=ident,
    )
    if setup:
        steps = [("task setup", repo_dir, c) for c in setup]
        # Build artefacts must not show up as the agent's changes: ignore what setup added,
        # and fold what it changed in tracked files into the base commit.
        steps.append(("task setup (record)", repo_dir, _RECORD_SETUP))
        await _build_in_sandbox(
            store,
            parent,
            dest,
            {},
            Limits(memory_mb=4096, pids=2048, cpus=2.0, disk_mb=8192),
            steps,
            setup_timeout_s,
            {},
        )
        amend = ["-c", "commit.gpgsign=false", "commit", "-q", "--amend", "--no-verify", "--allow-empty", "-C", "HEAD"]
        if _git(repo, "status", "--porcelain", "--untracked-files=no").strip():
            _git(repo, "add", "-u")
            _git(repo, *amend, env=ident)
    for junk in ("logs", "COMMIT_EDITMSG", "ORIG_HEAD", "description", "FETCH_HEAD", "hooks"):
        p = repo / ".git" / junk
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    _git(repo, "config", "user.name", "agent")
    _git(repo, "config", "user.email", "agent@sandbox.invalid")
    new_commit = _git(repo, "rev-parse", "HEAD").strip()
    return {
        "commit": new_commit,
        "source_commit": commit,
        "repo_dir": repo_dir,
        "hidden": hidden,
        "setup": list(setup),
        "source": str(source),
    }


# The setup commands' new files go to .git/info/exclude, anchored with a leading "/".
_RECORD_SETUP = (
    "mkdir -p .git/info && git status --porcelain=v1 --untracked-files=all "
    "| sed -n 's/^?? //p' | sed 's/^/\\//' >> .git/info/exclude"
)


# -- the layers by kind: recipe (the content key) + builder, handed to the store ----------
async def ensure_base(
    store: ImageStore, suite: str | None = None, mirror: str | None = None, packages: tuple[str, ...] = BASE_PACKAGES
) -> ImageRef:
    """The base layer for `suite` (default: the host's Debian suite)."""
    suite = suite or host_suite()
    recipe = {"kind": "base", "suite": suite, "packages": sorted(packages), "variant": "minbase", "v": RECIPE_VERSION}

    async def build(dest: Path) -> dict[str, Any]:
        debs = store.root / "debs"
        return await asyncio.to_thread(build_base, dest, suite, mirror, tuple(packages), debs)

    return await store.ensure("base", None, recipe, build)


async def ensure_env(store: ImageStore, base: ImageRef | str, spec: EnvSpec) -> ImageRef:
    """An environment layer on `base` with `spec`'s dependencies installed."""
    parent = store.get(base) if isinstance(base, str) else base
    recipe = {
        "kind": "env",
        "parent": parent.key,
        "pip": list(spec.pip),
        "wheels": [dir_fingerprint(d) for d in spec.wheel_dirs],
        "download": spec.download,
        "run": list(spec.run),
        "v": RECIPE_VERSION,
    }

    async def build(dest: Path) -> dict[str, Any]:
        return await build_env(store, parent, dest, spec)

    return await store.ensure("env", parent.key, recipe, build)


async def ensure_task(
    store: ImageStore,
    env: ImageRef | str,
    repo_path: str | Path,
    base_commit: str,
    hide_paths: list[str] | tuple[str, ...] = (),
    repo_dir: str = "/repo",
    setup: list[str] | tuple[str, ...] = (),
    setup_timeout_s: float = 1800.0,
) -> ImageRef:
    """A task layer: `repo_path` at `base_commit` in `repo_dir`, `hide_paths` removed,
    then `setup` commands (e.g. `pip install -e .`) run in it, offline."""
    parent = store.get(env) if isinstance(env, str) else env
    commit, tree = await asyncio.to_thread(resolve_commit, Path(repo_path), base_commit)
    recipe = {
        "kind": "task",
        "parent": parent.key,
        "commit": commit,
        "tree": tree,
        "hide": sorted(set(hide_paths)),
        "repo_dir": repo_dir,
        "setup": list(setup),
        "v": RECIPE_VERSION,
    }

    async def build(dest: Path) -> dict[str, Any]:
        return await build_task(
            store, parent, dest, Path(repo_path), commit, list(hide_paths), repo_dir, list(setup), setup_timeout_s
        )

    return await store.ensure("task", parent.key, recipe, build)
