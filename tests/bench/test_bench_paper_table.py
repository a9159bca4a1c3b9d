"""bench/paper_table.py's peak memory, wall time and per-harness split: a phase's peak counts
even when the process's maximum at exit was reset after it, a run resumed across sessions
counts every attempt's time, and a mixed run's reward and parse failures are each harness's."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bench.paper_table import run_peak_gb, run_wall, store_figures
from legorl.store.schema import init_schema


def test_the_peak_is_the_largest_phase_not_the_last() -> None:
    report = {"peak_rss_gb": {"eval_start": 0.64, "warm_start": 4.37, "eval_control": 0.78}}
    assert run_peak_gb(0.81, report) == 4.37
    assert run_peak_gb(5.0, report) == 5.0
    assert run_peak_gb(0.81, {}) == 0.81


def test_a_resumed_runs_wall_time_is_its_phases_over_every_attempt() -> None:
    report = {"phases_s": {"eval_start": 38.0, "warm_start": 1700.0, "gspo": 2262.0}}
    assert run_wall(4000.4, report, resumed=False) == {"wall_s": 4000.4}
    resumed = run_wall(2300.0, report, resumed=True)
    assert resumed["wall_s"] == 4000.0 and resumed["wall_s_last_attempt"] == 2300.0


def test_a_mixed_runs_reward_and_parse_failures_are_split_by_harness(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "run.sqlite")
    init_schema(db)
    rows = [  # (harness, reward, masked): a masked rollout's reward is not the agent's
        ("claude-code", 1.0, 0),
        ("claude-code", 0.0, 0),
        ("opencode", 0.0, 0),
        ("opencode", 1.0, 1),
    ]
    for k, (h, reward, masked) in enumerate(rows):
        db.execute(
            "INSERT INTO trajectories(session_id, step, harness, reward, masked, n_turns, n_segments, side_turns) "
            "VALUES (?, 0, ?, ?, ?, 3, 1, '[]')",
            (f"s{k}", h, reward, masked),
        )
    metrics = [
        (0, "rollout/parse_failure_rate", 0.3),
        (0, "rollout/parse_failure_rate/claude-code", 0.1),
        (0, "rollout/parse_failure_rate/opencode", 0.5),
        (1, "rollout/parse_failure_rate/opencode", 0.3),
    ]
    db.executemany("INSERT INTO metrics(step, key, value) VALUES (?, ?, ?)", metrics)
    db.commit()
    per = store_figures(tmp_path)["per_harness"]
    assert per["claude-code"]["reward_mean"] == 0.5 and per["opencode"]["reward_mean"] == 0.0
    assert per["opencode"]["masked_share"] == 0.5
    assert per["claude-code"]["parse_failure_rate"] == 0.1 and per["opencode"]["parse_failure_rate"] == 0.4
