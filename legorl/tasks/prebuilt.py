"""Prebuilt images by reference: a task's `image` naming a Docker image (present in the
local engine, or a tarball we `docker load`), never pulled.

The image is imported once into the layer cache (keyed by its Docker image id), with its
repository *taken out*: the repository directory (`/repo`, or `/testbed` as in the official
per-instance images) is moved from the image to the side, and the layer keeps the rest (the environment: interpreter,
installed
dependencies). The task layer on top is then built by the usual path (`ensure_task`):
the repository at `base_commit` as a fresh one-commit repository, so the agent stage on
such an image gets the same treatment as on ours: no future history (whatever branches,
tags, reflogs or packs the image's repository held stay on the host), the task's tests
as its `base_commit` has them (test_patch applied only when grading), no network (every
sandbox is `--network none`). Both backends then run it like any other task image.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from legorl.sandbox.images import ImageNotFound, ImageRef, ImageStore

DOCKER = "docker"
RECIPE = 2


class PrebuiltImageError(ValueError):
    """The named image is not usable (absent, not loadable, no repository inside)."""


def _docker(*args: str, timeout: float = 600, **kw: Any) -> subprocess.CompletedProcess:
    if shutil.which(DOCKER) is None:
        raise PrebuiltImageError("a prebuilt Docker image needs the docker CLI (run scripts/setup_sandbox.sh)")
    return subprocess.run([DOCKER, *args], capture_output=True, timeout=timeout, **kw)


def resolve(ref: str) -> str:
    """The local Docker image id of `ref`: an image name/id present locally, or a tarball
    (`.tar`, `.tar.gz`) that is `docker load`ed first. Never pulls."""
    path = Path(ref)
    if ref.endswith((".tar", ".tar.gz", ".tgz")):
        if not path.is_file():
            raise PrebuiltImageError(f"image tarball {ref} does not exist")
        proc = _docker("load", "-q", "-i", str(path))
        if proc.returncode != 0:
            raise PrebuiltImageError(f"docker load {ref} failed: {proc.stderr.decode()[-400:].strip()}")
        line = proc.stdout.decode().strip().splitlines()[-1:]
        ref = line[0].split(": ", 1)[1] if line and ": " in line[0] else ref
    proc = _docker("image", "inspect", "--format", "{{.Id}}", ref)
    if proc.returncode != 0:
        raise PrebuiltImageError(
            f"image {ref!r} is neither a key of the image cache nor a Docker image present locally "
            "(images are never pulled: `docker load` it, or name its tarball)"
        )
    return proc.stdout.decode().strip()


REPO_DIRS = ("/repo", "/testbed")  # ours, and the official per-instance images
WRAPPER = '#!/bin/sh\n# the interpreter of the imported image (first python on its ENV PATH)\nexec {python} "$@"\n'


def _image_path(image_id: str) -> list[str]:
    """The directories of the image's ENV PATH."""
    proc = _docker("image", "inspect", "--format", "{{json .Config.Env}}", image_id)
    env = json.loads(proc.stdout or b"null") or []
    for e in env:
        if e.startswith("PATH="):
            return [d for d in e[5:].split(":") if d]
    return []


def _export(image_id: str, rootfs: Path, source: Path) -> dict[str, Any]:
    """The image's filesystem into `rootfs`, its repository (at /repo or /testbed) moved to
    `source`. The official images keep the repository at /testbed and the project installed
    in a conda env on their ENV PATH: /testbed becomes a link to /repo, where the task layer
    puts the repository (so editable installs resolve), and that env's python becomes the
    sandbox's `python3` (what the grader and agents run)."""
    cid = _docker("create", "--network", "none", image_id, "/bin/true").stdout.decode().strip()
    if not cid:
        raise PrebuiltImageError(f"docker create {image_id} failed")
    try:
        exp = subprocess.Popen([DOCKER, "export", cid], stdout=subprocess.PIPE)
        tar = subprocess.run(
            ["tar", "-x", "-C", str(rootfs), "--numeric-owner", "--exclude=dev/*"],
            stdin=exp.stdout,
            capture_output=True,
            timeout=1800,
        )
        exp.wait(timeout=60)
        if exp.returncode != 0 or tar.returncode != 0:
            raise PrebuiltImageError(f"docker export {image_id} failed: {tar.stderr.decode()[-400:]}")
    finally:
        _docker("rm", "-f", cid)
    found = [d for d in REPO_DIRS if (rootfs / d.strip("/") / ".git").exists()]
    if not found:
        raise PrebuiltImageError(f"image {image_id[:19]} has no git repository at {' or '.join(REPO_DIRS)}")
    repo = rootfs / found[0].strip("/")
    shutil.move(str(repo), str(source))
    (rootfs / "repo").mkdir(exist_ok=True)
    python = ""
    if found[0] != "/repo":
        repo.symlink_to("/repo")
        for d in _image_path(image_id):
            cand = rootfs / d.strip("/") / "python3"
            if d not in ("/usr/local/bin", "/usr/bin", "/bin") and (cand.is_file() or cand.is_symlink()):
                python = f"{d.rstrip('/')}/python3"
                wrapper = rootfs / "usr/local/bin/python3"
                wrapper.parent.mkdir(parents=True, exist_ok=True)
                wrapper.write_text(WRAPPER.format(python=python))
                wrapper.chmod(0o755)
                break
    return {"repo_dir_in_image": found[0], "python": python or "python3"}


async def import_image(store: ImageStore, ref: str) -> tuple[ImageRef, Path]:
    """(the imported layer, the repository taken out of it) for a Docker image reference."""
    image_id = await asyncio.to_thread(resolve, ref)
    recipe = {"kind": "imported", "image_id": image_id, "v": RECIPE}

    async def build(dest: Path) -> dict[str, Any]:
        found = await asyncio.to_thread(_export, image_id, dest / "rootfs", dest / "source")
        return {"image": ref, "image_id": image_id, **found}

    layer = await store.ensure("base", None, recipe, build)  # a parentless layer, like a base
    return layer, layer.path / "source"


def is_cache_key(store: ImageStore, image: str) -> bool:
    """Is `image` a layer of the cache (a content key or a unique prefix of one)?"""
    if not re.fullmatch(r"[0-9a-f]{8,64}", image):
        return False
    try:
        store.get(image)
    except (ImageNotFound, ValueError):
        return False
    return True
