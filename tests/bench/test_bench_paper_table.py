"""bench/paper_table.py's peak memory and wall time: a phase's peak counts even when the
process's maximum at exit was reset after it, and a run resumed across sessions counts every
attempt's time."""

from __future__ import annotations

from bench.paper_table import run_peak_gb, run_wall


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
