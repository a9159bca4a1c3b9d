"""How much of a run's gain is sampling noise: its warm start and end, evaluated again.

A run's held-out rows are one draw each: 200 episodes sampled at temperature 1.0 on fixed
tasks. Two draws of the same checkpoint differ by several points, so a gain of a few points
says little on its own. This evaluates a finished `legorl train` run's warm start (the
weights the control started from, `RUN_DIR/control_start.pt`) and its end checkpoint again
through the run's harness config, interleaved for R rounds on the same held-out tasks, and
prints one JSON object: every draw, and per checkpoint the pooled rate with its 95% Wilson
interval beside the run's own row. With `--steps`, the checkpoints of those GSPO steps too
(a run that kept them: `[trainer] keep_checkpoints`), so the held-out rate can be read
along the run, not only at its ends: does the gain grow with steps, or peak and fall?

    .venv/bin/python bench/eval_resample.py RUN_DIR --config examples/quickstart-codex.toml
        [--rounds 2] [--tasks 200] [--steps 5,10]

A bench run (minutes per draw through a native harness), never a test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: `bench.paper_table`

from bench.paper_table import end_policy, evaluate_config  # noqa: E402
from legorl.loop.run_dir import CONTROL_START_FILE  # noqa: E402
from legorl.loop.stats import newcombe_diff, wilson  # noqa: E402


def warm_start_policy(run_dir: Path, end: Path, into: Path) -> Path:
    """The warm start as an HF model directory: the end checkpoint's directory (config and
    tokenizer) with the weights the warm start kept for the control."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(end, into)
    lm = AutoModelForCausalLM.from_pretrained(into)
    state = torch.load(run_dir / CONTROL_START_FILE, map_location="cpu", weights_only=False)["lm"]
    lm.load_state_dict(state, strict=True)
    lm.save_pretrained(into)
    return into


def pooled(draws: list[dict[str, Any]]) -> dict[str, Any]:
    """Resolved over every draw's episodes, with its 95% Wilson interval."""
    resolved = sum(d["resolved"] for d in draws)
    episodes = sum(d["episodes"] for d in draws)
    low, high = wilson(resolved, episodes)
    return {
        "draws": len(draws),
        "resolved": resolved,
        "episodes": episodes,
        "rate": round(resolved / episodes, 4) if episodes else None,
        "ci95": [round(low, 4), round(high, 4)],
        "rates": [d["rate"] for d in draws],
    }


def pooled_gain(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """The pooled end over the pooled warm start, in points, with Newcombe's 95% interval. The
    draws share their tasks, so the interval counts the sampling of the policy's replies, not
    how much another set of tasks would move both."""
    a, b = pooled(before), pooled(after)
    diff, low, high = newcombe_diff(a["resolved"], a["episodes"], b["resolved"], b["episodes"])
    return {"points": round(100 * diff, 1), "ci95": [round(100 * low, 1), round(100 * high, 1)]}


def draw(policy: Path, config: Path, tasks: int, out: Path) -> dict[str, Any]:
    """One held-out evaluation of `policy` through `config`'s harness (`legorl eval`'s own code)."""
    ev = evaluate_config(policy, config, tasks, out)
    if ev.get("error"):
        raise SystemExit(f"{config}: {ev['error']}")
    episodes = int(ev.get("samples") or 0)
    resolved = int((ev.get("status_counts") or {}).get("resolved", 0))
    return {"resolved": resolved, "episodes": episodes, "rate": round(resolved / episodes, 4) if episodes else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--config", type=Path, required=True, help="the run's config (its harness evaluates)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--work", type=Path, default=Path("/tmp/legorl-eval-resample"))
    ap.add_argument("--steps", default="", help="comma-separated GSPO steps whose kept checkpoints to draw too")
    args = ap.parse_args()
    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--steps: {args.steps!r} is not a comma-separated list of step numbers")
    if not (args.run_dir / CONTROL_START_FILE).is_file():
        raise SystemExit(f"{args.run_dir}: no {CONTROL_START_FILE} (a run with a warm start and a control writes it)")
    end = end_policy(args.run_dir, args.work / "end")
    warm = warm_start_policy(args.run_dir, end, args.work / "warm_start")
    mid = {f"step_{k}": end_policy(args.run_dir, args.work / f"step_{k}", step=k) for k in steps}
    report = json.loads((args.run_dir / "heldout_results.json").read_text())["evaluations"]
    policies = {"warm_start": warm, **mid, "end": end}
    draws: dict[str, list[dict[str, Any]]] = {name: [] for name in policies}
    for r in range(args.rounds):
        for name, policy in policies.items():
            t0 = time.monotonic()
            row = draw(policy, args.config, args.tasks, args.work / f"{name}-{r}")
            draws[name].append(row)
            wall = round(time.monotonic() - t0, 1)
            print(json.dumps({"round": r, "checkpoint": name, **row, "wall_s": wall}), file=sys.stderr, flush=True)
    out = {
        "bench": "eval_resample",
        "run_dir": str(args.run_dir),
        "config": str(args.config),
        "run_rows": {k: report[k]["resolved_rate"] for k in ("warm_start", "end") if k in report},
        "resampled": {k: pooled(v) for k, v in draws.items()},
        "gain_points": pooled_gain(draws["warm_start"], draws["end"]),
        **({"gain_points_at": {k: pooled_gain(draws["warm_start"], draws[k]) for k in mid}} if mid else {}),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
