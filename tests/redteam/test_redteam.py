"""The red team (`redteam.py`) against the grader, in real sandboxes on both backends: every
forgery scores 0 with a flag, while the honest fix of every task shape scores 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from legorl.types import Status
from legorl.verify.grade import grade
from tests.helpers.redteam import (
    LEDGER_F2P,
    NATIVE_FORGERIES,
    PYTEST_FORGERIES,
    Forgery,
    forgery_diff,
    ledger_task,
    native_files,
    native_task,
    package_files,
)
from tests.helpers.tasks_util import backend_and_images

BACKENDS = [pytest.param("local", id="local"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]
# Without test paths SWE-bench's usual command; with them, the file named.
TEST_CMDS = {"no-paths": "python -m pytest -q", "paths": "pytest -q tests/test_core.py"}


@pytest.fixture(scope="module")
def ledger_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("redteam")


def cases() -> list:  # type: ignore[type-arg]
    out = []
    for f in PYTEST_FORGERIES:
        for cmd in TEST_CMDS:
            out.append(pytest.param(f, cmd, "local", id=f"{f.name}-{cmd}-local"))
        out.append(pytest.param(f, "no-paths", "docker", id=f"{f.name}-no-paths-docker", marks=pytest.mark.docker))
    return out


@pytest.mark.parametrize("forgery,cmd,backend_name", cases())
async def test_forgery_scores_zero_with_a_flag(
    forgery: Forgery, cmd: str, backend_name: str, ledger_root: Path
) -> None:
    task = ledger_task(ledger_root, forgery.f2p, TEST_CMDS[cmd])
    diff = forgery_diff(forgery, package_files(task))
    async with backend_and_images(backend_name) as (backend, images):
        image = await images.for_task(task)
        out = await grade(task, diff, backend, image)
    detail = (forgery.name, out.status, out.flags, {k: v for k, v in out.evidence.items() if k != "test_output"})
    assert out.reward == 0.0 and not out.masked, detail
    assert out.status is Status.HACK_DETECTED and "tamper_attempt" in out.flags, detail


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_honest_fix_scores_one_on_every_ledger_shape(backend_name: str, ledger_root: Path) -> None:
    """The gold fix resolves each construct's task (approx, parametrize, class, subTest, plain);
    doing nothing does not."""
    async with backend_and_images(backend_name) as (backend, images):
        for shape in LEDGER_F2P:
            task = ledger_task(ledger_root, shape, TEST_CMDS["no-paths"])
            image = await images.for_task(task)
            gold = await grade(task, task.patch, backend, image)
            assert gold.status is Status.RESOLVED and gold.reward == 1.0 and gold.flags == [], (shape, gold)
            if shape == "subtest":
                empty = await grade(task, "", backend, image)
                assert empty.status is Status.FAILED and empty.reward == 0.0, (shape, empty)


def native_cases() -> list:  # type: ignore[type-arg]
    out = []
    for f in NATIVE_FORGERIES:
        out.append(pytest.param(f, "local", id=f"{f.name}-local", marks=pytest.mark.slow))
        out.append(pytest.param(f, "docker", id=f"{f.name}-docker", marks=[pytest.mark.slow, pytest.mark.docker]))
    return out


@pytest.mark.parametrize("forgery,backend_name", native_cases())
async def test_native_forgery_scores_zero_with_a_flag(forgery: Forgery, backend_name: str) -> None:
    """Django's runtests.py and SymPy's bin/test: subtest outcomes rewritten or swallowed,
    decoys under the real test's id, a skip raised from package code."""
    task = native_task(forgery.runner)
    diff = forgery_diff(forgery, native_files(task, forgery))
    async with backend_and_images(backend_name) as (backend, images):
        out = await grade(task, diff, backend, await images.for_task(task))
    detail = (forgery.name, out.status, out.flags, {k: v for k, v in out.evidence.items() if k not in ("test_output",)})
    assert out.reward == 0.0 and not out.masked, detail
    assert out.status is Status.HACK_DETECTED and "tamper_attempt" in out.flags, detail


EXHAUST = {
    # the workdir's disk (a tmpfs charged to the sandbox's memory on the local backend)
    "disk": "dd if=/dev/zero of=big bs=1M count=20000 2>/dev/null; echo done\n",
    "memory": "python3 -c 'x = bytearray(6 << 30)'; echo done\n",
}


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("what", sorted(EXHAUST))
async def test_resource_exhaustion_is_the_agents_failure(what: str, backend_name: str) -> None:
    """Filling the disk or the memory from inside is the agent's failure on both backends:
    reward 0, never masked (a masked rollout would drop out of its group and escape its 0)."""
    from tests.helpers.tasks_util import pick_task, rollout

    task = pick_task()
    async with backend_and_images(backend_name) as (backend, images):
        res = await rollout(task, EXHAUST[what], backend, images)
    o = res.outcome
    assert o.reward == 0.0 and not o.masked and o.status is not Status.INFRA_ERROR, (what, o)
    assert "host_oom" not in o.flags, (what, o)


def test_an_oom_at_the_sandboxs_own_limit_is_never_the_hosts() -> None:
    """A kill while the sandbox sits at its limit (a full tmpfs disk) is its own, even when the
    watermark had already counted that limit before."""
    from legorl.sandbox.cgroups import Counters

    before = Counters(oom_kills=1, memory_max_hits=2, near_limit=True)
    assert not Counters(oom_kills=3, memory_max_hits=2, near_limit=True).host_oom_since(before)
    assert Counters(oom_kills=2, memory_max_hits=0).host_oom_since(Counters(oom_kills=1))
