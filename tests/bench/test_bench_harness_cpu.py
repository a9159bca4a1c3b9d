"""bench/harness_cpu.py's summary: per figure the median over rounds and its spread."""

from __future__ import annotations

from bench.harness_cpu import summary


def test_each_figure_gets_its_median_and_spread_over_rounds() -> None:
    rows = [
        {"children_cpu_s": 6.8, "loop_cpu_s": 1.0, "turns": 1.0, "wall_s": 84.0},
        {"children_cpu_s": 7.4, "loop_cpu_s": 0.9, "turns": 1.1, "wall_s": 90.0},
        {"children_cpu_s": 6.5, "loop_cpu_s": 1.2, "turns": 1.0, "wall_s": 80.0},
    ]
    s = summary(rows)
    assert s["children_cpu_s"] == {"median": 6.8, "spread": [6.5, 7.4]}
    assert s["loop_cpu_s"]["median"] == 1.0 and s["wall_s"]["spread"] == [80.0, 90.0]
