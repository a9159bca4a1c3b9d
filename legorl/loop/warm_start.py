"""`[warm_start]`: imitation before RL — demonstrations through the real loop, then SFT.

A demonstrator engine (e.g. the quickstart's scripted expert, `kind = "quickstart-expert"`,
or any engine: a bigger model behind vLLM) plays `episodes` training tasks through a
rollout worker of its own: the same harness, sandboxes, proxy and grading as every other
rollout, so a demonstration is exactly what the proxy recorded — token ids the policy
will see in deployment, never re-rendered text. Each one is written to the run store as it
is graded (step `WARM_START_STEP`). Then the trainer's model is fine-tuned on them
(`legorl.train.sft`, with the trainer's own AdamW, whose moments GSPO inherits) and the
new weights are pushed to the engine.

Which demonstrations are imitated: `keep = "all"` (default; the quickstart's expert is
imperfect on purpose, and filtering by outcome would already be RL) or `"resolved"`.
Infrastructure errors are never imitated.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from legorl.loop.worker import RolloutBackend, RolloutRecord
from legorl.store.phase_steps import WARM_START_STEP
from legorl.types import Status, Task, Trajectory


def demo_tasks(train: list[Task], n: int, seed: int, distinct: int | None = None) -> list[Task]:
    """`n` training tasks for demonstrations, cycling through the first `distinct` of the
    shuffled split (all of it when None, or when the split is smaller)."""
    rng = random.Random(seed * 7_919 + 17)
    order = list(train)
    rng.shuffle(order)
    order = order[:distinct] if distinct else order
    return [order[i % len(order)] for i in range(n)]


async def record_demonstrations(
    worker: RolloutBackend,
    tasks: list[Task],
    limit: asyncio.Semaphore,
    on_record: Callable[[RolloutRecord], None],
    harness_of: Callable[[int, Task], str | None] = lambda k, t: None,
) -> list[RolloutRecord]:
    """One demonstrator rollout per task through `worker`, each recorded as it is graded;
    `harness_of(k, task)` picks the k-th demonstration's harness (a mixed-harness run's draw)."""
    groups = await asyncio.gather(
        *(
            worker.group(
                t, 1, step=WARM_START_STEP, limit=limit, on_record=on_record, tag="demo", harness=harness_of(k, t)
            )
            for k, t in enumerate(tasks)
        )
    )
    return [r for g in groups for r in g]


def imitated(records: list[RolloutRecord], keep: str) -> list[Trajectory]:
    """The demonstrations SFT trains on."""
    out = []
    for r in records:
        t = r.trajectory
        if not t.segments or t.outcome is None or t.outcome.masked:
            continue
        if keep == "resolved" and t.outcome.status is not Status.RESOLVED:
            continue
        out.append(t)
    return out
