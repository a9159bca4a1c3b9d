"""The learning check of tests/loop/test_loop_learns.py, synchronous and asynchronous
(`max_staleness = 1`). The two runs are in one file, so the suite's two workers
(`pytest -n 2 --dist loadfile`, scripts/test.sh) run them one after the other while the
other worker runs the rest. Side by side (each with 64 concurrent rollouts on 2 cores) they
took 25.4 and 24.7 minutes in CI, while the whole quickstart, about twice a slice's work,
takes ~9 minutes alone."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import ROOT

LEGORL = [sys.executable, "-m", "legorl.cli"]


def slice_config(tmp_path: Path, extra: dict[tuple[str, str], str] | None = None, **over: int) -> Path:
    """examples/quickstart.toml, smaller: the same sections and values, fewer of everything."""
    values = {
        "steps": 12,
        "tasks_per_step": 16,
        "heldout_tasks": 128,
        "episodes": 192,
        "sft_steps": 150,
        "control_steps": 0,
        **over,
    }
    where = {
        "steps": ("run", "steps"),
        "tasks_per_step": ("run", "tasks_per_step"),
        "heldout_tasks": ("heldout", "tasks"),
        "episodes": ("warm_start", "episodes"),
        "sft_steps": ("warm_start", "steps"),
        "control_steps": ("warm_start", "control_steps"),
    }
    want: dict[tuple[str, str], object] = {where[k]: v for k, v in values.items()}
    added = dict(extra or {})
    lines, section, done = [], "", set()
    for line in (ROOT / "examples" / "quickstart.toml").read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        key = line.split("=", 1)[0].strip()
        if (section, key) in want:
            line = f"{key} = {want[section, key]}"
            done.add((section, key))
        elif (section, key) == ("run", "dir"):
            line = f'dir = "{tmp_path / "run"}"'
        lines.append(line)
        if line.startswith("["):  # keys this slice adds to the section
            lines += [f"{k} = {v}" for (sec, k), v in added.items() if sec == section]
    assert done == set(want), set(want) - done
    text = "\n".join(lines) + "\n"
    path = tmp_path / "quickstart-slice.toml"
    path.write_text(text)
    return path


def assert_learns(tmp_path: Path, max_staleness: int, steps: int) -> None:
    """Synchronously, and asynchronously: with `max_staleness = 1` nearly every trajectory is
    one policy version old when it is trained on, and the loss takes its recorded behaviour
    logprobs as GSPO's π_old (`old_logprobs = "rollout"`), so the clip band is a trust region
    around the policy that sampled it: a trajectory whose probability the last update already
    moved the way its advantage points gets no second push. Those carry no gradient, so it
    learns more slowly per step and gets 16 steps to the synchronous run's 12 (in wall time,
    with a long-tailed agent, 16 asynchronous steps cost about 10 synchronous ones: 1.57×
    rollouts/min). docs/measured.md, "Asynchronous loop", has the seeds tried and why the importance-weight
    corrections were not robust here."""
    extra = {("run", "max_staleness"): max_staleness, ("trainer", "old_logprobs"): '"rollout"'} if max_staleness else {}
    config = slice_config(tmp_path, extra, steps=steps)
    proc = subprocess.run([*LEGORL, "train", str(config)], capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "run" / "heldout_results.json").read_text())
    ev = res["evaluations"]
    start, warm, end = (ev[k]["resolved_rate"] for k in ("start", "warm_start", "end"))
    assert ev["end"]["episodes"] == 128 and ev["end"]["masked"] == 0
    assert start <= 0.05  # the untrained policy does not solve these
    assert warm >= start + 0.15  # the warm start taught the commands
    # and GSPO taught where to apply them: on held-out tasks (this slice measured +22 points,
    # +15 with seed 1; the full quickstart +31) and, synchronously, on its own training rollouts (384 per side)
    assert end >= warm + 0.05, res
    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as db:
        rate = dict(db.execute("SELECT step, value FROM metrics WHERE key = 'resolved_rate'"))
        # step 0 is sampled by the warm-started policy before any GSPO update (128 rollouts); the
        # last three steps by the trained one (384: 3 × 16 tasks × 8). The rise must be significant (one-sided
        # two-proportion z-test at 5%), not a fixed margin: the slice's per-step noise is ~±4 points
        # and the rise mostly happens in the first update, so thirds against thirds flaked.
        last = sum(rate[s] for s in range(steps - 3, steps)) / 3
        if not max_staleness:
            assert rise_is_significant(rate[0], 128, last, 384), rate
        else:
            # Asynchronously, step 1's rollouts are sampled by the warm-started policy too, and on
            # the training split (which its demonstrations covered) it starts near its plateau:
            # one CI run had 47.6% on the 210 rollouts the warm-started version sampled and 50.6%
            # on the last three steps, while held-out rose 34.4 -> 56.3%. A +3-point rise on these
            # samples is not significant half the time, so here the check is that the training
            # rollouts did not collapse; the learning claim is the held-out one above.
            assert last >= rate[0] - 0.10, rate
        # every rollout of every phase is in the run store, graded
        rows = dict(
            db.execute("SELECT step < 0, count(*) FROM trajectories WHERE status IS NOT NULL GROUP BY step < 0")
        )
        spans = {s: (a, b) for s, a, b in db.execute("SELECT step, t_start, t_end FROM steps WHERE step >= 0")}
        stale = [v for (v,) in db.execute("SELECT value FROM metrics WHERE key = 'async/staleness_max'")]
    assert rows[1] == 192 + 3 * 128 and rows[0] == steps * 16 * 8  # dropped ones would be stored too
    if max_staleness:  # the next step's rollouts ran while the trainer trained, none older than allowed
        assert all(spans[s + 1][0] < spans[s][1] for s in range(steps - 1)), spans
        assert len(stale) == steps and max(stale) <= max_staleness


def rise_is_significant(p_before: float, n_before: int, p_after: float, n_after: int) -> bool:
    """One-sided two-proportion z-test (pooled), z >= 1.645: `after` is higher than `before`."""
    pooled = (p_before * n_before + p_after * n_after) / (n_before + n_after)
    se = (pooled * (1 - pooled) * (1 / n_before + 1 / n_after)) ** 0.5
    return se > 0 and (p_after - p_before) / se >= 1.645
