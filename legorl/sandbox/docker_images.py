"""The same cached layers as Docker images, made on demand and reused.

The base layer is `docker import`ed from a tar of its rootfs. An env or task layer is an
overlayfs upper directory; it becomes a Docker layer by writing it as a tar with overlay
whiteouts (0/0 character devices, the `trusted.overlay.opaque` xattr) turned into Docker's
`.wh.` files, and `docker load`ing an archive whose manifest lists the parent's layers
(already in Docker, so not repeated) plus this one. The Docker image of layer `key` is
tagged `legorl/<kind>:<key>`, so its identity is the cache's content hash.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import stat
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO

from legorl.sandbox.base import SandboxError
from legorl.sandbox.images import ImageRef, ImageStore

log = logging.getLogger(__name__)

DOCKER = os.environ.get("LEGORL_DOCKER", "docker")
IMAGE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
_known: dict[str, list[str]] = {}  # tag -> layer diff ids, for this process


async def _docker(*args: str, stdin: bytes | None = None, timeout_s: float = 600) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            DOCKER,
            *args,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except FileNotFoundError as e:
        raise SandboxError("the docker CLI is not installed (run scripts/setup_sandbox.sh)") from e
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SandboxError(f"docker {args[0]} timed out after {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise SandboxError(f"docker {' '.join(args[:2])} failed: {err.decode(errors='replace').strip()[-1500:]}")
    return out.decode()


async def docker_layers(tag: str) -> list[str] | None:
    """The diff ids of image `tag`, or None if Docker does not have it."""
    try:
        out = await _docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", tag, timeout_s=60)
    except SandboxError as e:
        if "No such image" in str(e) or "no such image" in str(e).lower():
            return None
        raise
    return list(json.loads(out))


async def ensure_docker_image(store: ImageStore, key: str) -> str:
    """The Docker image (tag) holding layer `key` and its parents; made if missing."""
    chain = store.chain(key)
    parent_layers: list[str] = []
    for ref in reversed(chain):  # base first
        layers = _known.get(ref.docker_tag) or await docker_layers(ref.docker_tag)
        if layers is None:
            t0 = time.monotonic()
            if ref.kind == "base":
                await _import_base(ref)
            else:
                await _load_layer(store, ref, parent_layers)
            layers = await docker_layers(ref.docker_tag)
            if layers is None:
                raise SandboxError(f"docker did not keep {ref.docker_tag}")
            log.info("docker image %s made in %.1f s", ref.docker_tag, time.monotonic() - t0)
        _known[ref.docker_tag] = layers
        parent_layers = layers
    return chain[0].docker_tag


async def _import_base(ref: ImageRef) -> None:
    tar = await asyncio.create_subprocess_exec(
        "tar", "-C", str(ref.rootfs), "--numeric-owner", "-cf", "-", ".", stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    changes = [a for e in IMAGE_ENV for a in ("--change", f"ENV {e.replace('=', ' ', 1)}")]
    imp = await asyncio.create_subprocess_exec(
        DOCKER,
        "import",
        *changes,
        "-",
        ref.docker_tag,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tar.stdout is not None and imp.stdin is not None
    while chunk := await tar.stdout.read(1 << 20):
        imp.stdin.write(chunk)
        await imp.stdin.drain()
    imp.stdin.close()
    _, err = await imp.communicate()
    await tar.wait()
    if tar.returncode != 0 or imp.returncode != 0:
        raise SandboxError(f"docker import of {ref.key} failed: {err.decode(errors='replace').strip()[-1500:]}")


class _HashingWriter(io.RawIOBase):
    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.sha = f, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.sha.update(b)
        return self.f.write(b)


def write_layer_tar(rootfs: Path, out: IO[bytes]) -> str:
    """Write an overlay upper dir as a Docker layer tar; returns its sha256 (the diff id)."""
    hw = _HashingWriter(out)
    with tarfile.open(fileobj=hw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirs, files in os.walk(rootfs):
            dirs.sort()
            rel_dir = os.path.relpath(dirpath, rootfs)
            for name in sorted(dirs) + sorted(files):
                full = os.path.join(dirpath, name)
                arc = name if rel_dir == "." else f"{rel_dir}/{name}"
                st = os.lstat(full)
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # overlay whiteout: deleted
                    _add_marker(tar, f"{os.path.dirname(arc)}/.wh.{name}".lstrip("/"))
                    continue
                info = tar.gettarinfo(full, arcname=arc)
                info.uname = info.gname = ""
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
                if stat.S_ISDIR(st.st_mode) and _is_opaque(full):
                    _add_marker(tar, f"{arc}/.wh..wh..opq")
    return "sha256:" + hw.sha.hexdigest()


def _add_marker(tar: tarfile.TarFile, arc: str) -> None:
    info = tarfile.TarInfo(arc)
    info.mode, info.mtime = 0o644, 0
    tar.addfile(info, io.BytesIO(b""))


def _is_opaque(path: str) -> bool:
    for attr in ("trusted.overlay.opaque", "user.overlay.opaque"):
        try:
            if os.getxattr(path, attr, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


async def _load_layer(store: ImageStore, ref: ImageRef, parent_layers: list[str]) -> None:
    tmp_root = store.root / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
        layer_path = Path(tmp) / "layer.tar"

        def write() -> str:
            with open(layer_path, "wb") as f:
                return write_layer_tar(ref.rootfs, f)

        diff_id = await asyncio.to_thread(write)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Env": IMAGE_ENV, "Cmd": ["/bin/sh"], "Labels": {"legorl.key": ref.key}},
            "rootfs": {"type": "layers", "diff_ids": [*parent_layers, diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z"} for _ in range(len(parent_layers) + 1)],
        }
        cfg_bytes = json.dumps(config).encode()
        cfg_name = hashlib.sha256(cfg_bytes).hexdigest() + ".json"
        # Layers Docker already has are named but not shipped: `docker load` skips any layer
        # whose chain it already holds.
        manifest = [
            {
                "Config": cfg_name,
                "RepoTags": [ref.docker_tag],
                "Layers": [f"{d.split(':', 1)[1]}/layer.tar" for d in parent_layers] + ["new/layer.tar"],
            }
        ]
        archive = Path(tmp) / "image.tar"

        def pack() -> None:
            with tarfile.open(archive, "w") as t:
                for name, data in (("manifest.json", json.dumps(manifest).encode()), (cfg_name, cfg_bytes)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
                t.add(layer_path, arcname="new/layer.tar")

        await asyncio.to_thread(pack)
        await _docker("load", "-q", "-i", str(archive), timeout_s=1800)


def remove_docker_images(refs: list[ImageRef]) -> None:
    """Best effort: remove the Docker images of these layers if Docker answers."""
    tags = [r.docker_tag for r in refs]
    if not tags:
        return
    try:
        subprocess.run([DOCKER, "rmi", "-f", *tags], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return
    for t in tags:
        _known.pop(t, None)
