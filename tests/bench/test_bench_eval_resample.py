"""bench/eval_resample.py's pooling: several draws of one checkpoint are one rate, and the end's
over the warm start's one gain with its interval."""

from __future__ import annotations

from bench.eval_resample import pooled, pooled_gain


def test_resampled_draws_pool_into_one_rate_and_one_gain() -> None:
    warm = [{"resolved": 55, "episodes": 200, "rate": 0.275}, {"resolved": 51, "episodes": 200, "rate": 0.255}]
    end = [{"resolved": 69, "episodes": 200, "rate": 0.345}, {"resolved": 75, "episodes": 200, "rate": 0.375}]
    p = pooled(warm)
    assert (p["resolved"], p["episodes"], p["rate"], p["draws"]) == (106, 400, 0.265, 2)
    assert p["ci95"][0] < 0.265 < p["ci95"][1]
    g = pooled_gain(warm, end)
    assert g["points"] == 9.5 and 0 < g["ci95"][0] < 9.5 < g["ci95"][1]
