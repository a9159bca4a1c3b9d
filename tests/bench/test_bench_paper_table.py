"""bench/paper_table.py's peak memory: a phase's peak counts even when the process's maximum
at exit was reset after it."""

from __future__ import annotations

from bench.paper_table import run_peak_gb


def test_the_peak_is_the_largest_phase_not_the_last() -> None:
    report = {"peak_rss_gb": {"eval_start": 0.64, "warm_start": 4.37, "eval_control": 0.78}}
    assert run_peak_gb(0.81, report) == 4.37
    assert run_peak_gb(5.0, report) == 5.0
    assert run_peak_gb(0.81, {}) == 0.81
