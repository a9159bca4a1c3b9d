"""The oracle check of a task: the gold changes resolve it, no changes do not.

Both are graded exactly as an agent's changes would be (fresh sandbox, hardened runner), so
a task that passes here can be trusted to tell a fix from no fix. The task's kind
(`tasks/kinds/`) says what its gold changes are and judges the two outcomes: a SWE-bench
row's gold `patch`, judged stricter than "resolved vs not" (with the empty patch every
FAIL_TO_PASS test must fail and every PASS_TO_PASS test pass, as SWE-bench's own validation
requires, `kinds/swebench.py:judge`); a Harbor task's `solution/solve.sh` must score 1 and
doing nothing 0 (`harbor_validate.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from legorl.sandbox.base import Backend, SandboxError
from legorl.tasks.image import TaskImages
from legorl.tasks.kinds import kind_of
from legorl.types import Outcome, Task
from legorl.verify.grade import GradeConfig, grade


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


async def check_task(task: Task, backend: Backend, images: TaskImages, cfg: GradeConfig | None = None) -> TaskCheck:
    t0 = time.monotonic()
    kind = kind_of(task)
    try:
        image = await images.for_task(task, kind)
    except (SandboxError, ValueError, RuntimeError, OSError, KeyError) as exc:  # a finding about this task, not a crash
        return TaskCheck(
            task.instance_id, False, [f"image: {type(exc).__name__}: {exc}"], seconds=time.monotonic() - t0
        )
    try:
        gold_changes = await kind.oracle(backend, image)
    except (ValueError, SandboxError) as exc:  # no oracle, or it failed: a finding about this task
        return TaskCheck(task.instance_id, False, [str(exc)], seconds=time.monotonic() - t0)
    gold = await grade(task, gold_changes, backend, image, cfg, kind)
    empty = await grade(task, "", backend, image, cfg, kind)
    problems = kind.judge_oracle(gold, empty)
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
