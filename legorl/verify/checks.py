"""`legorl doctor`'s grading self-test: on the run's first task, the oracle (the gold patch, or a
Harbor task's solution) is resolved and the empty patch is not.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from legorl.monitor.doctor import CheckFailed, check
from legorl.types import Status

if TYPE_CHECKING:
    from legorl.loop.config import RunConfig


@check("grading self-test", needs=("sandbox starts",), timeout=600)
def grading_check(cfg: RunConfig) -> str:
    from legorl.loop.startup import load_task_split
    from legorl.sandbox import open_backend
    from legorl.tasks.image import TaskImages
    from legorl.tasks.kinds import kind_of
    from legorl.verify.grade import grade

    try:
        task = load_task_split(cfg, cfg.run.split)[0]
    except ValueError as e:  # TaskFileError and an empty split
        raise CheckFailed(str(e), fix="fix run.tasks / run.split (see the message)") from None

    async def go() -> tuple[Any, Any]:
        kind = kind_of(task)
        images = TaskImages(backend=cfg.sandbox.backend)
        image = await images.for_task(task, kind)
        backend = open_backend(cfg.sandbox.backend, images.store)
        try:
            try:  # the gold patch, or a Harbor task's solution/solve.sh run as validate runs it
                gold_diff = await kind.oracle(backend, image)
            except ValueError as e:
                raise CheckFailed(
                    f"task {task.instance_id}: {e}", fix=f"run: legorl tasks validate {cfg.run.tasks}"
                ) from None
            return await grade(task, gold_diff, backend, image, kind=kind), await grade(
                task, "", backend, image, kind=kind
            )
        finally:
            await backend.aclose()

    gold, empty = asyncio.run(go())
    if gold.status is not Status.RESOLVED:
        raise CheckFailed(
            f"task {task.instance_id}: the gold patch gives {gold.status.value}, not resolved",
            fix=f"run: legorl tasks validate {cfg.run.tasks} (the task or its image is broken)",
        )
    if empty.status is Status.RESOLVED:
        raise CheckFailed(
            f"task {task.instance_id}: the empty patch resolves it",
            fix="the task's FAIL_TO_PASS tests do not fail before the fix; regenerate it",
        )
    return f"{task.instance_id}: gold resolved, empty {empty.status.value}"
