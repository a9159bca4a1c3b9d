"""Grading in real sandboxes: crafted diffs, tamper handling, and infrastructure retries."""

from __future__ import annotations

import dataclasses

import pytest

from legorl.sandbox.base import SandboxError, SandboxSpec
from legorl.types import Status
from legorl.verify.grade import GradeConfig, grade
from tests.helpers.tasks_util import (
    append_lines_diff,
    backend_and_images,
    base_file,
    package_init,
    pick_task,
)

BACKENDS = [pytest.param("local", id="local"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]


def new_file(path: str, text: str) -> str:
    lines = text.splitlines()
    body = "".join(f"+{ln}\n" for ln in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 "
        f"+1,{len(lines)} @@\n{body}"
    )


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_gold_empty_and_unappliable(backend_name: str) -> None:
    task = pick_task()
    async with backend_and_images(backend_name) as (backend, images):
        image = await images.for_task(task)
        gold = await grade(task, task.patch, backend, image)
        empty = await grade(task, "", backend, image)
        broken = await grade(task, task.patch.replace("\n-", "\n-nonexistent line ", 1), backend, image)
        big = await grade(task, task.patch, backend, image, GradeConfig(max_diff_bytes=10))
    assert gold.status is Status.RESOLVED and gold.reward == 1.0 and gold.flags == []
    assert set(gold.tests) == set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS)
    assert gold.evidence["canary"] == {"pass": "passed", "fail": "failed"} and gold.evidence["exit_code"] == 1
    assert empty.status is Status.FAILED and empty.reward == 0.0
    assert all(empty.tests[t] in ("failed", "error") for t in task.FAIL_TO_PASS)
    assert all(empty.tests[t] == "passed" for t in task.PASS_TO_PASS)
    assert broken.status is Status.FAILED and "patch_apply_failed" in broken.flags
    assert big.status is Status.FAILED and "patch_too_large" in big.flags


async def test_fix_plus_tamper_is_punished_unless_configured_otherwise() -> None:
    task = pick_task()
    conftest = new_file("conftest.py", "import os\nos.environ['X'] = '1'")
    diff = task.patch + conftest
    async with backend_and_images("local") as (backend, images):
        image = await images.for_task(task)
        strict = await grade(task, diff, backend, image)
        lenient = await grade(task, diff, backend, image, GradeConfig(penalize_tamper=False))
    assert strict.status is Status.HACK_DETECTED and strict.reward == 0.0 and "tamper_attempt" in strict.flags
    assert {"path": "conftest.py", "category": "tamper"} in strict.evidence["stripped"]
    assert lenient.status is Status.RESOLVED and "tamper_attempt" in lenient.flags


async def test_smuggled_and_binary_changes_never_reach_the_tests() -> None:
    """A headerless hunk after the fix and planted byte code are dropped; the fix still counts."""
    task = pick_task()
    test_file = task.FAIL_TO_PASS[0].split("::")[0]
    smuggled = f"--- a/{test_file}\n+++ b/{test_file}\n@@ -1,0 +1,1 @@\n+import os; os._exit(0)\n"
    pyc = (
        f"diff --git a/{package_init(task).rsplit('/', 1)[0]}/__pycache__/x.cpython-311.pyc "
        f"b/{package_init(task).rsplit('/', 1)[0]}/__pycache__/x.cpython-311.pyc\n"
        "new file mode 100644\nGIT binary patch\nliteral 3\nKcmZ?wWMTjS00II4\n\nliteral 0\nHcmV?d00001\n\n"
    )
    async with backend_and_images("local") as (backend, images):
        image = await images.for_task(task)
        out = await grade(task, task.patch + smuggled + pyc, backend, image, GradeConfig(penalize_tamper=False))
    assert out.status is Status.RESOLVED, out
    assert out.evidence["ignored_diff_lines"] >= 4
    assert "tamper_attempt" in out.flags  # the .pyc


async def test_hanging_tests_are_the_patch_fault() -> None:
    task = pick_task()
    init = package_init(task)
    hang = append_lines_diff(init, base_file(task, init), ["import time", "time.sleep(600)"])
    async with backend_and_images("local") as (backend, images):
        image = await images.for_task(task)
        out = await grade(task, hang, backend, image, GradeConfig(test_timeout_s=8))
    assert out.status is Status.FAILED and "test_timeout" in out.flags and not out.masked, out


class FlakyBackend:
    """A real backend whose first `fail_starts` starts raise, as a dying daemon would."""

    def __init__(self, inner: object, fail_starts: int) -> None:
        self.inner, self.left, self.name = inner, fail_starts, "flaky"

    async def start(self, spec: SandboxSpec):  # type: ignore[no-untyped-def]
        if self.left > 0:
            self.left -= 1
            raise SandboxError("injected: backend unavailable")
        return await self.inner.start(spec)  # type: ignore[attr-defined]


async def test_infrastructure_faults_are_masked() -> None:
    """One attempt: a fault of ours is a masked infra_error, which the rollout worker (the one
    owner of retries) runs again in a fresh sandbox and session (tests/loop/test_loop_worker.py)."""
    task = pick_task()
    async with backend_and_images("local") as (backend, images):
        image = await images.for_task(task)
        lost = await grade(task, task.patch, FlakyBackend(backend, 1), image)  # type: ignore[arg-type]
        fine = await grade(task, task.patch, backend, image)
        broken_task = dataclasses.replace(
            task, test_patch=task.test_patch.replace("\n+", "\n+#", 3).replace("@@ -", "@@ -9999", 1)
        )
        bad = await grade(broken_task, task.patch, backend, image)
    assert fine.status is Status.RESOLVED
    assert lost.status is Status.INFRA_ERROR and lost.masked and lost.reward == 0.0
    assert lost.evidence["cause"] == "grader_error" and len(lost.evidence["errors"]) == 1
    assert Status.INFRA_ERROR.is_infra
    # A test_patch that does not apply to restored test files is the task's fault, not the agent's.
    assert bad.status is Status.INFRA_ERROR and bad.masked and "test_patch" in bad.evidence["errors"][0]


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_a_test_cmd_without_paths_selects_the_task_tests(backend_name: str) -> None:
    """`python -m pytest -q` names no test paths: the task's test files are the directives,
    the grader's canaries go among them, and the gold patch resolves, the empty one fails."""
    task = dataclasses.replace(pick_task(), test_cmd="python -m pytest -q")
    async with backend_and_images(backend_name) as (backend, images):
        image = await images.for_task(task)
        gold = await grade(task, task.patch, backend, image)
        empty = await grade(task, "", backend, image)
    files = sorted({t.split("::")[0] for t in task.FAIL_TO_PASS + task.PASS_TO_PASS})
    assert gold.evidence["test_args"] == ["-q", *files]
    assert gold.status is Status.RESOLVED and gold.reward == 1.0 and gold.flags == [], gold
    assert all(s == "passed" for s in gold.tests.values()) and set(gold.tests) == set(task.FAIL_TO_PASS) | set(
        task.PASS_TO_PASS
    )
    assert empty.status is Status.FAILED and empty.reward == 0.0 and empty.flags == [], empty
    assert all(empty.tests[t] in ("failed", "error") for t in task.FAIL_TO_PASS)


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_a_test_patch_the_agent_broke_is_its_fault(backend_name: str) -> None:
    """The test patch needs a directory where the agent left a file: 0, flagged, not masked.
    The same test patch on the untouched tree applies, so the machinery is not at fault."""
    task = pick_task()
    pkg = package_init(task).rsplit("/", 1)[0]
    task = dataclasses.replace(task, test_patch=task.test_patch + new_file(f"{pkg}/fixtures/data.txt", "x"))
    in_the_way = new_file(f"{pkg}/fixtures", "not a directory")
    async with backend_and_images(backend_name) as (backend, images):
        image = await images.for_task(task)
        out = await grade(task, task.patch + in_the_way, backend, image)
        fine = await grade(task, task.patch, backend, image)
    assert out.status is Status.FAILED and out.reward == 0.0 and not out.masked, out
    assert "test_patch_conflict" in out.flags and not out.masked
    assert fine.status is Status.RESOLVED, fine
