"""The oracle check of a task: the gold patch resolves it, the empty patch does not.

Both are graded exactly as an agent's diff would be (fresh sandbox, hardened runner), so a
task that passes here can be trusted to tell a fix from no fix. Stricter than "resolved
vs not": with the empty patch every FAIL_TO_PASS test must fail and every PASS_TO_PASS
test must pass, as SWE-bench's own validation requires.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from legorl.sandbox.base import Backend, SandboxError
from legorl.tasks.image import TaskImages
from legorl.types import Outcome, Status, Task
from legorl.verify.grade import GradeConfig, grade
from legorl.verify.junit import TestStatus


@dataclass
class TaskCheck:
    instance_id: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    gold: Outcome | None = None
    empty: Outcome | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "ok": self.ok,
            "problems": self.problems,
            "gold": self.gold.status.value if self.gold else None,
            "empty": self.empty.status.value if self.empty else None,
            "seconds": round(self.seconds, 2),
        }


def judge(task: Task, gold: Outcome, empty: Outcome) -> list[str]:
    """What is wrong with a task given its gold and empty outcomes (empty list: valid)."""
    problems = []
    for name, out in (("gold", gold), ("empty", empty)):
        if out.masked or out.status.is_infra:
            problems.append(f"{name} patch: infrastructure error: {out.evidence.get('errors', out.evidence)}")
    if problems:
        return problems
    if gold.status is not Status.RESOLVED:
        bad = {t: s for t, s in gold.tests.items() if not TestStatus(s).ok}
        problems.append(f"gold patch: {gold.status.value} (flags {gold.flags}); failing: {dict(list(bad.items())[:5])}")
    if empty.status is Status.RESOLVED:
        problems.append("empty patch: resolved (the tests do not detect the bug)")
    still_pass = [t for t in task.FAIL_TO_PASS if TestStatus(empty.tests.get(t, "missing")).ok]
    if still_pass:
        problems.append(f"empty patch: FAIL_TO_PASS tests pass without the fix: {still_pass[:5]}")
    broken = [t for t in task.PASS_TO_PASS if not TestStatus(empty.tests.get(t, "missing")).ok]
    if broken:
        problems.append(f"empty patch: PASS_TO_PASS tests fail without the fix: {broken[:5]}")
    return problems


async def check_task(task: Task, backend: Backend, images: TaskImages, cfg: GradeConfig | None = None) -> TaskCheck:
    t0 = time.monotonic()
    try:
        image = await images.for_task(task)
    except (SandboxError, ValueError, RuntimeError, OSError, KeyError) as exc:  # a finding about this task, not a crash
        return TaskCheck(
            task.instance_id, False, [f"image: {type(exc).__name__}: {exc}"], seconds=time.monotonic() - t0
        )
    if task.kind == "harbor":  # solution/solve.sh must score 1, doing nothing 0 (harbor_validate.py)
        from legorl.tasks.harbor_validate import check_harbor

        problems, hgold, hempty = await check_harbor(task, backend, image)
        return TaskCheck(task.instance_id, not problems, problems, hgold, hempty, time.monotonic() - t0)
    gold = await grade(task, task.patch, backend, image, cfg)
    empty = await grade(task, "", backend, image, cfg)
    problems = judge(task, gold, empty)
    return TaskCheck(task.instance_id, not problems, problems, gold, empty, time.monotonic() - t0)


async def check_tasks(
    tasks: list[Task],
    backend: Backend,
    images: TaskImages,
    cfg: GradeConfig | None = None,
    concurrency: int = 2,
    on_result: Callable[[TaskCheck], None] | None = None,
) -> list[TaskCheck]:
    """Check every task, `concurrency` at a time; results in the order of `tasks`."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(t: Task) -> TaskCheck:
        async with sem:
            res = await check_task(t, backend, images, cfg)
        if on_result is not None:
            on_result(res)
        return res

    return list(await asyncio.gather(*(one(t) for t in tasks)))
