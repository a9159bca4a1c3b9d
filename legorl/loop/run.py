"""`Run`: what the phases of one `legorl train` share, built once by `train.py`.

The phases (`phases.py`: the held-out evaluations, the warm start, the GSPO steps, the
control) take a `Run` instead of threading eight arguments through every call. It holds
the parts, not the policy's state: the trainer owns its weights and version
(`bump_version`, `snapshot`, `restore`), the store owns the record, the report the table.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.loop.report import Report
from legorl.loop.worker import RolloutBackend, RolloutRecord
from legorl.store.run_store import RunStore
from legorl.train.trainer import Trainer
from legorl.types import Task


@dataclass
class Run:
    """One run's shared parts. `worker` is set once the rollout backend is open (the phases
    run inside it); `ranks > 1` under torchrun, where the followers train on what rank 0
    broadcasts."""

    cfg: RunConfig
    trainer: Trainer
    tasks: list[Task]
    heldout: list[Task]
    store: RunStore
    report: Report
    tokenizer: Any
    console: Console
    ranks: int = 1
    worker: RolloutBackend | None = None
    limit: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.limit = asyncio.Semaphore(self.cfg.run.max_concurrent_rollouts)

    @property
    def rollouts(self) -> RolloutBackend:
        if self.worker is None:
            raise RuntimeError("the rollout backend is not open yet (phases run inside `async with`)")
        return self.worker

    def on_record(self, rec: RolloutRecord) -> None:
        """Each rollout is stored the moment it is graded, before anything trains on it."""
        record(self.store, [rec], self.tokenizer)


def record(store: RunStore, records: list[RolloutRecord], tokenizer: Any) -> None:
    """Persist rollouts (turns first, then the trajectory with its outcome); a store that
    cannot be written (a full disk) ends the run with one message."""
    try:
        _record(store, records, tokenizer)
    except sqlite3.Error as e:
        raise RunError(f"run store {store.path}: {e}. Free space there, then `legorl train CONFIG --resume`") from None


def _record(store: RunStore, records: list[RolloutRecord], tokenizer: Any) -> None:
    for rec in records:
        t = rec.trajectory
        pieces = [[tokenizer.decode([i]) for i in turn.completion_ids] for turn in rec.turns]
        with store.transaction():  # the rollout's whole record or nothing (a kill, a full disk)
            store.start_session(t.session_id, step=t.step, instance_id=t.instance_id, harness=t.harness)
            for turn, p in zip(rec.turns, pieces, strict=True):
                store.add_turn(turn, p)
            store.add_trajectory(t)
