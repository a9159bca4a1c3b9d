"""Issue 36 on the native runners (Django's and SymPy's own), in real sandboxes on both
backends: the test file's names rebound by package code (class 3) score 0 with
`test_globals_rebound`; a setup failure forged after the go (class 4), canaries steered into
"cannot vouch" (class 5) and lines the official Django parser crashes on (class 6) stay the
agent's 0, never masked; the honest fix still scores 1."""

from __future__ import annotations

import pytest

from legorl.types import Status
from tests.helpers.redteam import forgery_diff, native_files, native_task
from tests.helpers.redteam_grading_native import NATIVE_MASKING_FORGERIES, NATIVE_NAMES_FORGERIES
from tests.helpers.tasks_util import backend_and_images


def _cases(forgeries: list) -> list:  # type: ignore[type-arg]
    out = []
    for f in forgeries:
        out.append(pytest.param(f, "local", id=f"{f.name}-local", marks=pytest.mark.slow))
        out.append(pytest.param(f, "docker", id=f"{f.name}-docker", marks=[pytest.mark.slow, pytest.mark.docker]))
    return out


def _detail(name: str, out: object) -> tuple:  # type: ignore[type-arg]
    o = out
    return (name, o.status, o.flags, {k: v for k, v in o.evidence.items() if k != "test_output"})  # type: ignore[attr-defined]


async def _grade(forgery, backend_name: str):  # type: ignore[no-untyped-def]
    from legorl.verify.grade import grade

    task = native_task(forgery.runner)
    diff = forgery_diff(forgery, native_files(task, forgery))
    async with backend_and_images(backend_name) as (backend, images):
        return await grade(task, diff, backend, await images.for_task(task))


@pytest.mark.parametrize("forgery,backend_name", _cases(NATIVE_NAMES_FORGERIES))
async def test_a_test_files_names_rebound_on_a_native_runner_score_zero(forgery, backend_name: str) -> None:  # type: ignore[no-untyped-def]
    out = await _grade(forgery, backend_name)
    detail = _detail(forgery.name, out)
    assert out.reward == 0.0 and not out.masked, detail
    assert out.status is Status.HACK_DETECTED and "test_globals_rebound" in out.flags, detail


@pytest.mark.parametrize("forgery,backend_name", _cases(NATIVE_MASKING_FORGERIES))
async def test_a_fault_forged_on_a_native_runner_is_the_agents_zero(forgery, backend_name: str) -> None:  # type: ignore[no-untyped-def]
    """No tagged setup line, a log whose bad lines are skipped: nothing to confirm, no control.
    Canaries steered into "cannot vouch" claim a fault, which the empty-diff control confirms
    is the agent's (whether the package's patch lands before the canaries run is a race)."""
    out = await _grade(forgery, backend_name)
    detail = _detail(forgery.name, out)
    assert out.reward == 0.0 and not out.masked, detail
    assert "runner_fault" not in out.flags, detail
    if forgery.cls == "steered_canaries":
        assert ("control" in out.evidence) == ("canary_fault" in out.flags), detail
    else:
        assert "control" not in out.evidence, detail
    if forgery.cls == "parser_crash":
        assert "log_lines_skipped" in out.flags, detail


@pytest.mark.parametrize(
    "runner,backend_name",
    [
        pytest.param(r, b, id=f"{r}-{b}", marks=[pytest.mark.slow] + ([pytest.mark.docker] if b == "docker" else []))
        for r in ("django", "sympy")
        for b in ("local", "docker")
    ],
)
async def test_the_honest_fix_on_a_native_runner_scores_one(runner: str, backend_name: str) -> None:
    """The names checks before, after and during each test leave the gold fix resolved."""
    from legorl.verify.grade import grade

    task = native_task(runner)
    async with backend_and_images(backend_name) as (backend, images):
        gold = await grade(task, task.patch, backend, await images.for_task(task))
    assert gold.status is Status.RESOLVED and gold.reward == 1.0 and gold.flags == [], _detail(runner, gold)
