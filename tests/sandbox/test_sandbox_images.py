"""The layered image cache: env layers from offline wheels, task layers, Docker parity,
cache hits, prune and the `legorl images` CLI."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import uuid
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from legorl.sandbox import (
    EnvSpec,
    ImageNotFound,
    ImageRef,
    ImageStore,
    SandboxSpec,
)
from legorl.sandbox.cli import app
from legorl.sandbox.docker_images import docker_layers, ensure_docker_image, remove_docker_images
from legorl.sandbox.layers import ensure_base, ensure_env, ensure_task
from legorl.sandbox.testing import DemoRepo, demo_repo

ENV_RUN = (
    "rm /etc/debian_version",  # a deleted base file: a whiteout in the layer
    "rm -rf /usr/share/doc/git && mkdir /usr/share/doc/git && echo x > /usr/share/doc/git/only",  # an opaque dir
)


def make_wheel(out_dir: Path) -> Path:
    """A real, minimal, byte-for-byte reproducible pure-Python wheel."""
    files = {
        "legorl_demo_pkg/__init__.py": b"VALUE = 42\n",
        "legorl_demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: legorl-demo-pkg\nVersion: 1.0\n",
        "legorl_demo_pkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: legorl-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()
    )
    files["legorl_demo_pkg-1.0.dist-info/RECORD"] = (record + "legorl_demo_pkg-1.0.dist-info/RECORD,,\n").encode()
    path = out_dir / "legorl_demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), data)
    os.utime(path, (1_700_000_000, 1_700_000_000))  # same fingerprint, same key, on every run
    return path


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    make_wheel(d)
    return d


@pytest.fixture(scope="session")
def env(store: ImageStore, wheels: Path) -> ImageRef:
    async def build() -> ImageRef:
        spec = EnvSpec(pip=("legorl-demo-pkg==1.0",), wheel_dirs=(str(wheels),), run=ENV_RUN)
        return await ensure_env(store, await ensure_base(store), spec)

    return asyncio.run(build())


async def test_env_layer_from_offline_wheels_on_both_backends(
    backend, store: ImageStore, env: ImageRef, repo: DemoRepo
) -> None:
    task = await ensure_task(store, env, repo.path, repo.base)
    assert [r.kind for r in store.chain(task.key)] == ["task", "env", "base"]
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        res = await sb.exec("python3 -c 'import legorl_demo_pkg; print(legorl_demo_pkg.VALUE)'")
        assert res.stdout == "42\n", res
        assert (await sb.exec("test -e /etc/debian_version")).exit_code == 1
        assert (await sb.exec("ls /usr/share/doc/git")).stdout == "only\n"
        assert (await sb.exec("test -e /legorl-build || test -e /tmp/legorl-requirements.txt")).exit_code == 1
        assert (await sb.exec("git log --oneline | wc -l")).stdout == "1\n"


async def test_cache_hits_are_recorded(store: ImageStore, env: ImageRef, wheels: Path) -> None:
    before = store.stats().get("hits", {}).get("env", 0)
    spec = EnvSpec(pip=("legorl-demo-pkg==1.0",), wheel_dirs=(str(wheels),), run=ENV_RUN)
    again = await ensure_env(store, env.parent or "", spec)
    assert again.key == env.key
    assert store.stats()["hits"]["env"] >= before + 1
    assert env.meta["build_s"] > 0 and env.meta["size_bytes"] > 0
    changed = EnvSpec(pip=("legorl-demo-pkg==1.0",), wheel_dirs=(str(wheels),), run=(*ENV_RUN, "true"))
    from legorl.sandbox.images import content_key

    assert content_key({**env.meta["recipe"], "run": list(changed.run)}) != env.key


async def test_task_setup_is_part_of_the_base(backend, store: ImageStore, repo: DemoRepo) -> None:
    setup = [
        "mkdir -p build && echo artefact > build/out.txt && echo gen > generated.txt "
        "&& sed -i 's/# bug/# set up/' calc.py"
    ]
    task = await ensure_task(store, await ensure_base(store), repo.path, repo.base, setup=setup)
    assert task.meta["source_commit"] == repo.base and task.meta["commit"] != repo.base
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        assert (await sb.exec("cat generated.txt build/out.txt")).stdout == "gen\nartefact\n"
        assert (await sb.exec("git status --porcelain")).stdout == ""
        assert await sb.diff(repo.base) == ""
        assert "# set up" in (await sb.read_file("calc.py")).decode()


async def test_bad_inputs_name_what_is_wrong(store: ImageStore, repo: DemoRepo, tmp_path: Path) -> None:
    base = await ensure_base(store)
    with pytest.raises(ValueError, match="not a commit"):
        await ensure_task(store, base, repo.path, "f" * 40)
    with pytest.raises(ValueError, match="not a directory"):
        EnvSpec(wheel_dirs=(str(tmp_path / "nope"),))
    with pytest.raises(TypeError, match="list of strings"):
        EnvSpec(pip="requests")  # type: ignore[arg-type]
    with pytest.raises(ImageNotFound, match="not in the cache"):
        store.get("0123456789abcdef")


@pytest.mark.docker
async def test_prune_removes_layer_children_and_docker_images(store: ImageStore, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    env = await ensure_env(store, await ensure_base(store), EnvSpec(run=(f"echo {marker} > /etc/legorl-test",)))
    r = demo_repo(tmp_path / f"repo-{marker}")
    (r.path / "unique.txt").write_text(marker)
    task = await ensure_task(store, env, r.path, r.future)
    tag = await ensure_docker_image(store, task.key)
    assert await docker_layers(tag) is not None
    removed = store.prune(keys=[env.key], on_removed=remove_docker_images)
    assert sorted(removed) == sorted([env.key, task.key])
    for key in removed:
        with pytest.raises(ImageNotFound):
            store.get(key)
    assert await docker_layers(tag) is None
    assert store.get(env.parent or "").kind == "base"  # parents stay


def test_cli(store: ImageStore) -> None:
    runner = CliRunner()
    asyncio.run(ensure_base(store))
    res = runner.invoke(app, ["ls"])
    assert res.exit_code == 0 and "base" in res.output
    res = runner.invoke(app, ["ls", "--json"])
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert any(row["kind"] == "base" for row in rows)
    res = runner.invoke(app, ["prune"])
    assert res.exit_code == 1 and "say what to prune" in res.output
    res = runner.invoke(app, ["prune", "--all", "--kind", "bogus"])
    assert res.exit_code == 1 and "bogus" in res.output
    res = runner.invoke(app, ["prune", "ffffffffffffffffffff"])
    assert res.exit_code == 1 and "not in the cache" in res.output
    res = runner.invoke(app, ["stats"])
    assert res.exit_code == 0 and "hits" in json.loads(res.output)
