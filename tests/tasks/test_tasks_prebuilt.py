"""Prebuilt images by reference (issue 15): a task's `image` names a Docker image we built
here from our debootstrap base (`docker commit` → `docker save` → the task names the
tarball, which is `docker load`ed; never pulled). Its repository holds the *future*: the
fix committed on a branch and a tag. The agent's view of the task image on both backends
has none of it, and the task validates (gold → resolved, empty → not)."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import subprocess
from pathlib import Path

import pytest

from legorl.sandbox import open_backend
from legorl.sandbox.base import SandboxSpec
from legorl.sandbox.docker_images import ensure_docker_image
from legorl.sandbox.images import ImageStore
from legorl.sandbox.layers import ensure_base
from legorl.tasks.image import TaskImages, materialize_repo
from legorl.tasks.prebuilt import PrebuiltImageError, resolve
from legorl.tasks.validate import check_task
from legorl.types import Task
from tests.helpers.tasks_util import pick_task, require_backend

pytestmark = pytest.mark.docker
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": "/usr/bin:/bin",
    "GIT_AUTHOR_NAME": "u",
    "GIT_AUTHOR_EMAIL": "u@x",
    "GIT_COMMITTER_NAME": "u",
    "GIT_COMMITTER_EMAIL": "u@x",
}


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=GIT_ENV, input=stdin, capture_output=True, check=True
    ).stdout.decode()


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, check=True, timeout=600).stdout.decode().strip()


def build_image(tmp: Path, layout: str) -> tuple[Task, str, str]:
    """(a shipped task naming an image tarball, the future commit inside it, its name).

    `ours`: the repository at /repo. `official`: as the official per-instance images have
    it, the repository at /testbed and the project's environment first on the image's
    ENV PATH (a venv at /opt/env here, a conda env there)."""
    store = ImageStore()
    task = pick_task("pytoolz/toolz")
    repo = tmp / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "fetch", "-q", str(materialize_repo(task.repo_path, store.root)), "+refs/remotes/origin/*:refs/heads/*")
    git(repo, "checkout", "-q", "-b", "future", task.base_commit)
    git(repo, "apply", stdin=task.patch.encode())
    git(repo, "commit", "-qam", "the fix, from the future")
    future = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "tag", "v-next")
    git(repo, "checkout", "-q", "--detach", task.base_commit)
    base_tag = asyncio.run(ensure_docker_image(store, asyncio.run(ensure_base(store)).key))
    name = f"legorl-test-prebuilt:{secrets.token_hex(4)}"
    if layout == "official":
        cid = docker(
            "create", "--network", "none", base_tag, "python3", "-m", "venv", "--system-site-packages", "/opt/env"
        )
        docker("start", "-a", cid)
        change = ["--change", "ENV PATH=/opt/env/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    else:
        cid, change = docker("create", "--network", "none", base_tag, "/bin/true"), []
    try:
        docker("cp", str(repo), f"{cid}:{'/testbed' if layout == 'official' else '/repo'}")
        docker("commit", *change, cid, name)
    finally:
        docker("rm", "-f", cid)
    tar = tmp / "image.tar"
    docker("save", "-o", str(tar), name)
    docker("rmi", name)  # the task brings it back with `docker load`
    return dataclasses.replace(task, image=str(tar), repo_path=""), future, name


def test_a_missing_image_is_a_clear_error_and_never_pulled() -> None:
    require_backend("docker")
    with pytest.raises(PrebuiltImageError, match="never pulled"):
        resolve("legorl-no-such-image:never")
    with pytest.raises(PrebuiltImageError, match="does not exist"):
        resolve("/nonexistent/image.tar")


@pytest.mark.parametrize("layout,backend_name", [("ours", "local"), ("official", "docker")])
def test_the_agent_sees_no_future_and_the_task_validates(tmp_path: Path, layout: str, backend_name: str) -> None:
    require_backend("docker")
    task, future, name = build_image(tmp_path, layout)

    async def run() -> None:
        backend = open_backend(backend_name)
        images = TaskImages(backend_name)
        try:
            key = await images.for_task(task)
            async with await backend.start(SandboxSpec(image=key, workdir="/repo")) as sb:
                log = await sb.exec(
                    f"git log --all --oneline | wc -l; git tag | wc -l; git cat-file -e {future} 2>/dev/null && echo "
                    "LEAK || echo clean"
                )
                assert log.exit_code == 0 and log.stdout.split()[:2] == ["1", "0"] and "LEAK" not in log.stdout, log
                net = await sb.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 2)\"")
                assert net.exit_code != 0
                if layout == "official":  # the image's environment is the sandbox's python3; /testbed is the repository
                    env = await sb.exec("python3 -c 'import sys; print(sys.prefix)'; readlink /testbed")
                    assert env.stdout.split() == ["/opt/env", "/repo"], env
            res = await check_task(task, backend, images)
            assert res.ok, res.problems
        finally:
            await backend.aclose()
            subprocess.run(["docker", "rmi", name], capture_output=True)  # what `docker load` brought back

    asyncio.run(run())
