"""A few steps of examples/smollm2-calc.toml on one device, timed, printed as one JSON object.

The example's run (SmolLM2-135M-Instruct through mini-swe-agent-warm in local sandboxes,
GSPO) shrunk to `--steps` steps without the warm start and the held-out evaluations, with
the engine and the trainer on `--device`: what bench/device_check.sh runs on a GPU to show
the real-model path works there (engine sampling, proxy, harness, grading, trainer step,
weight sync), and how long a step takes.

    python bench/smollm2_steps.py --device cuda --steps 3
    python bench/smollm2_steps.py --device cpu --steps 1 --tiny    # a dry check, ~2 rollouts
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "smollm2-calc.toml"


def config(run_dir: Path, device: str, steps: int, tiny: bool) -> object:
    from legorl.loop.config import RunConfig, load_run_config

    d = load_run_config(EXAMPLE).model_dump()
    d["run"].update(dir=run_dir, steps=steps, time_budget_s=None)
    d["heldout"]["tasks"] = 0
    d["warm_start"].update(episodes=0, control_steps=0)
    d["trainer"]["zero_variance_groups"] = "keep"  # an untrained policy's groups are mostly all-fail
    if device != "cpu":
        d["engine"].update(device=device, dtype="bfloat16")
        d["trainer"].update(device=device, dtype="bfloat16")
    if tiny:
        d["run"].update(tasks_per_step=1, group_size=2, max_concurrent_rollouts=2)
        d["calc_tasks"].update(train=2, heldout=1)
        d["proxy"]["max_tokens"] = 8
        d["harness"]["max_turns"] = 1
    return RunConfig.model_validate(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="one task, two rollouts, 8 tokens: a dry check")
    args = ap.parse_args()
    from legorl.loop.train import train
    from legorl.store.run_store import RunStore

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        t0 = time.monotonic()
        summary = asyncio.run(train(config(run_dir, args.device, args.steps, args.tiny)))
        wall = time.monotonic() - t0
        with RunStore(run_dir, readonly=True) as store:
            history = store.metrics_history()
            total = store.list_trajectories(limit=1)["total"]
    keep = ("train/loss", "train/step_s", "train/sampled_tokens", "mismatch/pearson", "rollout/resolved_rate")
    steps = [{k: h[k] for k in ("step", *keep) if k in h} for h in history]
    print(
        json.dumps(
            {
                "device": args.device,
                "steps": len(summary["steps"]),
                "rollouts": total,
                "wall_s": round(wall, 1),
                "loss_finite": all(math.isfinite(h.get("train/loss", math.nan)) for h in history),
                "per_step": steps,
            }
        )
    )


if __name__ == "__main__":
    main()
