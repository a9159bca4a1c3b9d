"""Shared helpers of the task/grading/hack tests: real backends, shipped tasks, rollouts."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from legorl.harness.command import CommandHarness
from legorl.rollout import RolloutConfig, RolloutResult, run_rollout
from legorl.sandbox import open_backend
from legorl.sandbox.base import Limits
from legorl.tasks.image import TaskImages
from legorl.tasks.loader import load_shipped
from legorl.types import Task


def docker_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def require_backend(name: str) -> None:
    """Fail (not skip) when a backend CI is supposed to have is missing: say how to get it."""
    if name == "docker" and not docker_ready():
        pytest.fail("docker is not running: run `bash scripts/setup_sandbox.sh` (CI runs it via scripts/setup.sh)")


@contextlib.asynccontextmanager
async def backend_and_images(name: str) -> AsyncIterator[tuple[object, TaskImages]]:
    require_backend(name)
    backend = open_backend(name)
    try:
        yield backend, TaskImages(name)
    finally:
        await backend.aclose()


def pick_task(repo: str = "pytoolz/toolz", split: str = "train") -> Task:
    """A deterministic shipped task of `repo` whose gold patch touches one source file."""
    tasks = sorted((t for t in load_shipped(split) if t.repo == repo), key=lambda t: t.instance_id)
    assert tasks, f"no shipped {split} task of {repo}"
    return tasks[0]


def source_file(task: Task) -> str:
    """The (single) library file the gold patch changes."""
    line = next(ln for ln in task.patch.splitlines() if ln.startswith("+++ b/"))
    return line[len("+++ b/") :]


def package_init(task: Task) -> str:
    """`pkg/__init__.py` of the package holding the buggy file (imported by every test)."""
    parts = Path(source_file(task)).parts
    return f"{parts[0]}/__init__.py" if len(parts) > 1 else source_file(task)


async def rollout(
    task: Task, script: str, backend: object, images: TaskImages, limits: Limits | None = None, timeout_s: float = 300
) -> RolloutResult:
    image = await images.for_task(task)
    cfg = RolloutConfig(agent_timeout_s=timeout_s, limits=limits or Limits())
    return await run_rollout(task, CommandHarness(script), backend, image, cfg)  # type: ignore[arg-type]


def added_file(diff: str, path: str) -> str:
    """The content of a file the agent's diff adds (the agent reports findings this way)."""
    out, inside, in_hunk = [], False, False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            inside = line.endswith(f" b/{path}")
            in_hunk = False
            continue
        if inside and line.startswith("@@"):
            in_hunk = True
            continue
        if inside and in_hunk and line.startswith("+"):
            out.append(line[1:])
    return "\n".join(out)


def base_file(task: Task, path: str) -> str:
    """A file of the task's repository at its base commit (read on the host)."""
    from legorl.sandbox.images import ImageStore
    from legorl.tasks.image import materialize_repo

    repo = materialize_repo(task.repo_path, ImageStore().root)
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{task.base_commit}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def append_lines_diff(path: str, original: str, added: list[str]) -> str:
    """A git diff appending `added` lines to a file whose content is `original`."""
    lines = original.splitlines()
    assert original.endswith("\n")
    ctx = lines[-3:]
    start = len(lines) - len(ctx) + 1
    body = "".join(f" {ln}\n" for ln in ctx) + "".join(f"+{ln}\n" for ln in added)
    return (
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -{start},{len(ctx)} "
        f"+{start},{len(ctx) + len(added)} @@\n{body}"
    )
