"""The learning quickstart end to end (issue 7): SFT warm start, then GSPO, on 2 CPU cores.

Runs `examples/quickstart.toml` (or --config) from a cold process and prints one JSON
object: the three held-out resolved rates (start, after SFT, after GSPO) with episode
counts and 95% Wilson intervals — for the in-process evaluation of every held-out episode
and for the subset run through the real mini-swe-agent + proxy + hf engine — GSPO's gain
over its own SFT checkpoint with Newcombe's 95% interval, the control (more SFT instead of
GSPO, from the same checkpoint) when configured, wall time per phase, the total
wall time from process start (imports included), the CPU seconds this run used, and the
machine's load average before and after (the machine is shared; a loaded machine makes
the same run slower, not different).

    .venv/bin/python bench/quickstart.py [--config examples/quickstart.toml] [--out DIR]
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
    ap.add_argument("--seed", type=int, default=None, help="override [quickstart] seed")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="legorl-quickstart-"))
    load_before = os.getloadavg()

    from legorl.quickstart.config import load_quickstart
    from legorl.quickstart.run import run_with_config

    cfg = load_quickstart(args.config)
    if args.seed is not None:
        cfg.seed = args.seed
    res = run_with_config(cfg, out)
    total = time.perf_counter() - T_PROCESS
    rows = {}
    keep = ("resolved_rate", "resolved", "episodes", "ci95", "wall_s", "replay_parity_turns",
            "in_process_resolved_same_tasks")  # fmt: skip
    for name, by_path in res["table"].items():
        rows[name] = {path: {k: ev[k] for k in keep if k in ev} for path, ev in by_path.items()}
    print(json.dumps({
        "bench": "quickstart",
        "config": str(args.config),
        "run_dir": str(out),
        "resolved": rows,
        "gspo_gain_over_sft": res["gspo_gain_over_sft"],
        "control_more_sft": res.get("control_more_sft"),
        "seed": cfg.seed,
        # imports (torch, transformers), model load and Python start-up: outside the phases
        "phases_s": {"process_start_and_imports": round(total - res["wall_s"], 1), **res["phases_s"]},
        "wall_s_total": round(total, 1),
        "within_15_min": total <= 900,
        "cpu_s": round(cpu_seconds(), 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cores": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
