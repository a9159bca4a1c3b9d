"""The quickstart end to end: `legorl train examples/quickstart.toml`, from a cold process.

The one loop (legorl/loop/train.py) on the quickstart config: held-out evaluation of the
untrained policy, demonstrations through the warm mini-swe-agent + proxy + expert engine
in local sandboxes, SFT, held-out evaluation, GSPO, held-out evaluation, the control (more
SFT instead of GSPO) and its evaluation — every episode a real rollout, graded by
legorl.verify. Prints one JSON object: the held-out table (resolved rates, graded and
masked counts, 95% Wilson intervals), the gains with Newcombe's 95% intervals, wall time
per phase, peak resident memory per phase and per GSPO step (and the process's own peak:
`legorl/loop/memory.py`), the total wall time from process start (imports included), the CPU seconds
this run used (its own and its children's: sandboxes, the harness driver, grading) and
the machine's load average before and after (a loaded machine makes the same run slower,
not different).

    .venv/bin/python bench/quickstart.py [--config examples/quickstart.toml] [--seed N] [--out DIR]
"""

from __future__ import annotations

import time

T_PROCESS = time.perf_counter()

import argparse
import json
import os
import resource
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.toml")
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: a fresh temp dir)")
    ap.add_argument("--seed", type=int, default=None, help="override [run] seed (and the engines' seeds)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="legorl-quickstart-"))
    load_before = os.getloadavg()

    import asyncio

    from rich.console import Console

    from legorl.loop.config import load_run_config
    from legorl.loop.train import train

    cfg = load_run_config(args.config)
    cfg.run.dir = out
    if args.seed is not None:
        cfg.run.seed = cfg.engine.seed = cfg.warm_start.engine.seed = cfg.trainer.seed = args.seed
    summary = asyncio.run(train(cfg, console=Console(stderr=True)))
    total = time.perf_counter() - T_PROCESS
    rep = summary.get("heldout", {})
    budget = cfg.run.time_budget_s or 900.0  # the quickstart's promise: 15 minutes
    print(
        json.dumps(
            {
                "bench": "quickstart",
                "config": str(args.config),
                "run_dir": str(out),
                "seed": cfg.run.seed,
                "evaluations": rep.get("evaluations"),
                "gains": rep.get("gains"),
                "phases_s": {
                    "process_start_and_imports": round(total - rep.get("wall_s", total), 1),
                    **rep.get("phases_s", {}),
                },
                "gspo_steps": len(summary["steps"]),
                "curve": [  # the training curve: each GSPO step's rollouts
                    {
                        "step": i,
                        "reward_mean": round(m.get("reward/mean", 0.0), 4),
                        "resolved_rate": round(m.get("resolved_rate", 0.0), 4),
                        "parse_failure_rate": round(m.get("rollout/parse_failure_rate", 0.0), 4),
                        "step_s": round(m.get("time/step_s", 0.0), 1),
                        "peak_rss_gb": round(m.get("mem/peak_rss_gb", 0.0), 2),
                    }
                    for i, m in enumerate(summary["steps"])
                ],
                "peak_rss_gb": rep.get("peak_rss_gb"),  # each phase's peak resident memory, this process
                "peak_rss_gb_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
                "wall_s_total": round(total, 1),
                "budget_s": budget,
                "within_budget": total <= budget,
                "cpu_s": round(cpu_seconds(), 1),
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
