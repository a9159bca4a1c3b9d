"""`[heldout]`: held-out evaluation at fixed points of a run, through the same loop.

The policy as it is at `start`, after the `warm_start`, at the `end` of GSPO (and the
warm-start control, `[warm_start] control_steps`) plays the first `tasks` tasks of the
held-out split once each, sampled at the proxy's temperature (the distribution that is
trained), through the same worker, harness, sandboxes and grading as training rollouts.
Each rollout is written to the run store as it is graded (step `HELDOUT_STEP`, session
ids `eval-<label>-…`); the resolved rates get 95% Wilson intervals, a gain Newcombe's
interval (`stats.py`). Infrastructure errors are left out of both counts and reported.
"""

from __future__ import annotations

import asyncio
import time

from legorl.loop.stats import Evaluation, summarize
from legorl.loop.worker import OnRecord, RolloutBackend
from legorl.store.phase_steps import HELDOUT_STEP, eval_session_tag
from legorl.types import Status, Task


async def evaluate_heldout(
    worker: RolloutBackend,
    tasks: list[Task],
    label: str,
    limit: asyncio.Semaphore,
    on_record: OnRecord,
    harness: str | None = None,
) -> Evaluation:
    t0 = time.monotonic()
    tag = eval_session_tag(label)  # a resume tells the phases apart by it (store/phase_steps.py)
    groups = await asyncio.gather(
        *(
            worker.group(t, 1, step=HELDOUT_STEP, limit=limit, on_record=on_record, tag=tag, harness=harness)
            for t in tasks
        )
    )
    outcomes = [r.trajectory.outcome for g in groups for r in g]
    return summarize(
        label, ((o.status is Status.RESOLVED, o.masked, o.status.value) for o in outcomes if o), time.monotonic() - t0
    )
