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


def test_a_kept_step_is_a_policy_and_a_step_not_kept_is_refused_by_name(tmp_path) -> None:
    """`--steps`: a GSPO step's kept checkpoint becomes an HF directory with the policy's
    tokenizer; a step the run did not keep exits naming the ones it did."""
    import json

    import pytest

    from bench.paper_table import end_policy

    run = tmp_path / "run"
    for k in (3, 5):
        (run / "checkpoints" / f"step_{k:08d}" / "model").mkdir(parents=True)
        (run / "checkpoints" / f"step_{k:08d}" / "model" / "config.json").write_text(json.dumps({"step": k}))
    got = end_policy(run, tmp_path / "p3", step=3)
    assert json.loads((got / "config.json").read_text()) == {"step": 3}
    assert any(f.name.startswith("tokenizer") for f in got.iterdir())
    assert json.loads((end_policy(run, tmp_path / "end") / "config.json").read_text()) == {"step": 5}
    with pytest.raises(SystemExit, match=r"no checkpoint of step 4 \(kept: \[3, 5\]"):
        end_policy(run, tmp_path / "p4", step=4)


def test_steps_that_are_not_numbers_exit_2_with_one_line(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "eval_resample.py"
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--config", "x.toml", "--steps", "5,ten"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--steps: '5,ten' is not a comma-separated list" in r.stderr
    assert "Traceback" not in r.stderr
