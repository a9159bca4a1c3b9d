"""Store what the trainer computed for every trained trajectory (issue 38, item 5).

The trainer keeps its pre-update logprobs of the step's segments (`Trainer.step(...,
keep_logprobs=n)`, legorl/train/kept_logprobs.py); this writes them into the run store in one
transaction, after the step's rollouts are recorded and before its checkpoint, so the
trajectory page colours a trained rollout's tokens by trainer log-prob and by trainer −
rollout. It is a diagnostic: a segment the store does not hold (or holds with another
length) is counted, never a reason to stop the run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from legorl.store.run_store import RunStore
from legorl.train.kept_logprobs import KeptLogprobs
from legorl.types import Trajectory


def store_trainer_logprobs(
    store: RunStore, trajectories: Sequence[Trajectory], kept: KeptLogprobs | None
) -> dict[str, float]:
    """Write `kept` (keyed by index into `trajectories`); the metrics of what it cost."""
    if kept is None:
        return {}
    t0 = time.monotonic()
    written = failed = 0
    with store.transaction():
        for (i, seg), lp_T in sorted(kept.segments.items()):
            try:
                store.set_segment_trainer_logprobs(trajectories[i].session_id, seg, lp_T)
                written += 1
            except (KeyError, ValueError):
                failed += 1
    return {
        "store/trainer_logprobs_segments": float(written),
        "store/trainer_logprobs_tokens": float(kept.tokens),
        "store/trainer_logprobs_over_budget": float(kept.dropped),
        "store/trainer_logprobs_failed": float(failed),
        "time/trainer_logprobs_s": time.monotonic() - t0,
    }
