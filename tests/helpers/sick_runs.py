"""Copies of a healthy run's store made sick on purpose through the store's own API, one per
failure signature: `legorl status` (tests/ops/), the plugin skills (tests/plugin/) and the
UI's status page (tests/monitor/ui/) read the same sick runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from legorl.store.run_store import RunStore

HEALTHY_STEP: dict[str, float] = {
    "train/trained": 1.0,
    "train/grad_norm": 0.5,
    "train/lr": 1e-4,
    "mismatch/pearson": 0.9999,
    "mismatch/mean_abs_dp": 1e-4,
    "groups/zero_variance_share": 0.5,
    "status/infra_error": 0.0,
    "rollout/turns_mean": 2.0,
    "rollout/parse_failure_rate": 0.0,
    "resolved_rate": 0.5,
    "reward/mean": 0.5,
}
SICK: dict[str, list[dict[str, float]]] = {  # steps 2, 3, 4 on top of the real run's 0, 1
    "mismatch": [{}, {}, {"mismatch/pearson": 0.75}],
    "lr_zero": [{}, {"train/lr": 0.0}, {"train/lr": 0.0}],
    "gradient_starvation": [{"train/grad_norm": 0.0}] * 3,
    "infra_avalanche": [{"status/infra_error": 0.05}, {"status/infra_error": 0.2}, {"status/infra_error": 0.6}],
    "heldout_fake_zero": [
        {},
        {},
        {"heldout/end/resolved_rate": 0.0, "heldout/end/episodes": 8.0, "heldout/end/masked": 0.0},
    ],
    "tool_collapse": [
        {"rollout/turns_mean": 3.0},
        {"rollout/turns_mean": 2.0, "rollout/parse_failure_rate": 0.1},
        {"rollout/turns_mean": 1.0, "rollout/parse_failure_rate": 0.4},
    ],
    "zero_variance": [{"groups/zero_variance_share": 1.0}] * 3,
}


def copy_store(src: Path, dest: Path) -> Path:
    """A copy of a run directory's store (SQLite's backup: consistent even under a writer)."""
    dest.mkdir(parents=True)
    with (
        sqlite3.connect(f"file:{src / 'run.sqlite'}?mode=ro", uri=True) as a,
        sqlite3.connect(dest / "run.sqlite") as b,
    ):
        a.backup(b)
    return dest


def sick_store(healthy: Path, dest: Path, steps: list[dict[str, float]]) -> Path:
    copy_store(healthy, dest)
    with RunStore(dest) as store:
        for k, extra in enumerate(steps):
            store.log_metrics(2 + k, {**HEALTHY_STEP, **extra})
    return dest
