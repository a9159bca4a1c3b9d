"""Faults classified by cause, on both backends: a sandbox killed from outside (a signal to
its pid 1 from the host, `docker kill`, the container removed) and a dead backend are
infrastructure — masked, flagged with the cause, never a reward of 0 — and the backend
recovers; what the agent does inside its own limits stays the agent's
(tests/verify/test_verify_rollout.py: `kill -9 -1`, OOM, a full disk; here: its own memory limit
vs an OOM outside it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from legorl.harness.command import CommandHarness
from legorl.rollout import RolloutConfig, run_rollout
from legorl.sandbox.base import Limits, SandboxSpec
from legorl.types import Status
from tests.helpers.backends import BACKENDS
from tests.helpers.tasks_util import backend_and_images, pick_task


class Recording:
    """A backend that remembers the sandboxes it started (to kill one from outside)."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.name, self.started = backend, backend.name, []

    async def start(self, spec: SandboxSpec) -> Any:
        sb = await self.backend.start(spec)
        self.started.append(sb)
        return sb


async def _kill_when_running(rec: Recording, kill: Any) -> None:
    for _ in range(600):
        if rec.started:
            await asyncio.sleep(1.0)  # the agent's command is running
            kill(rec.started[0])
            return
        await asyncio.sleep(0.05)


def _pid1(sb: Any) -> int:
    return int(sb.netns_path.split("/")[2])  # /proc/<host pid of the sandbox's init>/ns/net


def _docker(*args: str, sb: Any) -> None:
    cid = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=legorl.sandbox={sb.id}"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(cid) == 1, cid
    subprocess.run(["docker", *args, cid[0]], capture_output=True, check=True)


# (backend, how the sandbox is killed from outside, the flags that name it)
KILLS = [
    ("local", "sigkill_pid1", {"killed_by_signal_9"}),
    ("docker", "sigkill_pid1", {"killed_by_signal_9"}),
    ("docker", "docker_kill", {"killed_by_signal_9"}),
    # `rm -f` kills, then deletes: inspected in between it reads as the kill.
    ("docker", "docker_rm", {"container_removed", "killed_by_signal_9"}),
]
KILLERS = {
    "sigkill_pid1": lambda sb: os.kill(_pid1(sb), signal.SIGKILL),
    "docker_kill": lambda sb: _docker("kill", sb=sb),
    "docker_rm": lambda sb: _docker("rm", "-f", sb=sb),
}


@pytest.mark.parametrize(
    ("backend_name", "how", "flags"),
    [pytest.param(*k, marks=[pytest.mark.docker] if k[0] == "docker" else [], id=f"{k[0]}-{k[1]}") for k in KILLS],
)
async def test_sandbox_killed_from_outside_is_infrastructure(backend_name: str, how: str, flags: set[str]) -> None:
    task = pick_task()
    async with backend_and_images(backend_name) as (backend, images):
        image = await images.for_task(task)
        rec = Recording(backend)
        killer = asyncio.create_task(_kill_when_running(rec, KILLERS[how]))
        res = await run_rollout(task, CommandHarness("sleep 30"), rec, image, RolloutConfig(agent_timeout_s=60))
        await killer
        o = res.outcome
        assert o.status is Status.INFRA_ERROR and o.masked and o.reward == 0.0, o
        assert len(o.flags) == 1 and o.flags[0] in flags and o.evidence["cause"] == o.flags[0], o
        again = await run_rollout(task, CommandHarness("true"), backend, image, RolloutConfig(agent_timeout_s=60))
        assert again.outcome.status is Status.NO_PATCH  # the backend is fine: the next rollout runs


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_killing_every_process_it_can_see_stays_the_agents(backend_name: str) -> None:
    """`kill -9 -1` from inside (its own harness included) cannot reach the init: graded, unmasked."""
    task = pick_task()
    async with backend_and_images(backend_name) as (backend, images):
        image = await images.for_task(task)
        harness = CommandHarness("echo x >> README.rst; kill -9 -1; sleep 5")
        res = await run_rollout(task, harness, backend, image, RolloutConfig(agent_timeout_s=60))
    o = res.outcome
    assert o.status is Status.FAILED and not o.masked and o.reward == 0.0 and not o.flags, o


async def test_dead_zygote_is_infrastructure_and_the_backend_recovers() -> None:
    task = pick_task()
    async with backend_and_images("local") as (backend, images):
        image = await images.for_task(task)
        rec = Recording(backend)
        killer = asyncio.create_task(
            _kill_when_running(rec, lambda _sb: os.kill(backend._zygote.proc.pid, signal.SIGKILL))
        )
        res = await run_rollout(task, CommandHarness("sleep 30"), rec, image, RolloutConfig(agent_timeout_s=60))
        await killer
        o = res.outcome
        assert o.status is Status.INFRA_ERROR and o.masked and o.flags == ["backend_died"], o
        again = await run_rollout(task, CommandHarness("true"), backend, image, RolloutConfig(agent_timeout_s=60))
        assert again.outcome.status is Status.NO_PATCH  # a new zygote started


ALLOC_300MB = "echo x >> README.rst; python3 -c 'b = bytearray(300 << 20); b[::4096] = b\"x\" * len(b[::4096])'"


@contextlib.contextmanager
def _enclosing_cgroup(cg: Any, memory_mb: int) -> Iterator[None]:
    """Make `cg` create sandboxes inside a cgroup whose memory limit is below theirs: what
    the host running out of memory looks like from a sandbox (an OOM kill outside its own
    limit), without exhausting the host."""
    from legorl.sandbox.cgroups import PREFIX

    saved = dict(cg.bases)
    made = []
    try:
        for ctrl, base in saved.items():
            d = base / f"{PREFIX}{os.getpid()}-enclosing"
            d.mkdir()
            made.append(d)
            if cg.version == 2:
                (d / "cgroup.subtree_control").write_text("+memory +pids +cpu")
                (d / "memory.max").write_text(str(memory_mb << 20))
            elif ctrl == "memory":
                (d / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
            cg.bases[ctrl] = d
        yield
    finally:
        cg.bases.clear()
        cg.bases.update(saved)
        for d in made:
            d.rmdir()


@contextlib.contextmanager
def _enclosing_docker_cgroup(backend: Any, memory_mb: int) -> Iterator[None]:
    """The same for Docker (cgroupfs driver, v1): containers under a parent with that limit."""
    from legorl.sandbox.cgroups import PREFIX, _mounts

    name = f"{PREFIX}{os.getpid()}-enclosing"
    mounts = _mounts()
    if "memory" not in mounts:
        pytest.skip("the Docker enclosing-cgroup check needs cgroup v1's memory hierarchy")
    (mounts["memory"] / name).mkdir()
    (mounts["memory"] / name / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
    backend.cgroup_parent = "/" + name
    try:
        yield
    finally:
        backend.cgroup_parent = "/"
        for d in Path("/sys/fs/cgroup").glob(f"*/{name}"):  # runc made it in every hierarchy
            with contextlib.suppress(OSError):
                d.rmdir()


# (backend, the sandbox's own memory limit, the limit of a cgroup enclosing it or None)
OOMS = [("local", 192, None), ("local", 1024, 192), ("docker", 192, None), ("docker", 1024, 192)]


@pytest.mark.parametrize(
    ("backend_name", "own_mb", "enclosing_mb"),
    [
        pytest.param(
            *k,
            marks=[pytest.mark.docker] if k[0] == "docker" else [],
            id=f"{k[0]}-{'outside_its_limit' if k[2] else 'own_limit'}",
        )
        for k in OOMS
    ],
)
async def test_oom_of_the_sandbox_is_the_agents_an_oom_outside_it_is_infrastructure(
    backend_name: str, own_mb: int, enclosing_mb: int | None
) -> None:
    task = pick_task()
    async with backend_and_images(backend_name) as (backend, images):
        image = await images.for_task(task)
        cfg = RolloutConfig(agent_timeout_s=60, limits=Limits(memory_mb=own_mb))
        enclosing: Any = contextlib.nullcontext()
        if enclosing_mb and backend_name == "local":
            cg = backend._preflight()
            if not cg.bases:
                pytest.skip("no cgroup hierarchy here")
            enclosing = _enclosing_cgroup(cg, enclosing_mb)
        elif enclosing_mb:
            enclosing = _enclosing_docker_cgroup(backend, enclosing_mb)
        with enclosing:
            res = await run_rollout(task, CommandHarness(ALLOC_300MB), backend, image, cfg)
        o = res.outcome
        if enclosing_mb:
            assert o.status is Status.INFRA_ERROR and o.masked and o.flags == ["host_oom"], o
        else:
            assert not o.masked and not o.status.is_infra and "resource_exhausted" in o.flags, o


def test_leftover_cgroups_of_a_killed_run_are_removed_at_the_next_start() -> None:
    from legorl.sandbox.cgroups import PREFIX, Cgroups

    cg = Cgroups()
    if not cg.bases:
        pytest.skip("no cgroup hierarchy here")
    dead = [base / f"{PREFIX}{4_000_000 + os.getpid()}-0-dead" for base in cg.bases.values()]  # > pid_max: gone
    alive = [base / f"{PREFIX}{os.getpid()}-0-live" for base in cg.bases.values()]
    for d in dead + alive:
        d.mkdir()
    try:
        cg.sweep()
        assert not any(d.exists() for d in dead)  # its process is gone: removed at once
        assert all(d.exists() for d in alive)  # ours, fresh: kept
    finally:
        for d in dead + alive:
            if d.exists():
                d.rmdir()
