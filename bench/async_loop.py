"""Synchronous vs asynchronous (`[run] max_staleness = 1`) training with a long-tailed agent.

The same `legorl train` run twice — the `command` harness as an agent whose rollouts are
long-tailed (it asks the policy twice through the proxy, then works for 1 s, or 10 s in
one rollout of ten, then applies the task's fix in half of the rollouts; every rollout is
graded and every step trains), the tiny
`hf` engine, local sandboxes, shipped tasks, GSPO with the behaviour logprobs as π_old
(`old_logprobs = "rollout"`, what the learning test's asynchronous run uses), in both runs — once
synchronous (each step waits for its slowest rollout, then trains) and once with the
next step's rollouts running while the trainer trains. Prints one JSON object:
rollouts/min over the GSPO phase, trainer idle fraction (share of the phase the trainer
waited for rollouts, asynchronous run; in the synchronous run it waits for every step's
whole rollout phase), staleness and dropped trajectories, and the speed-up.

    .venv/bin/python bench/async_loop.py [--steps 6] [--tasks-per-step 4] [--group-size 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from legorl.loop.config import load_run_config
from legorl.loop.train import train
from legorl.tasks.loader import load_shipped

ROOT = Path(__file__).resolve().parents[1]
# examples/agents/ask-twice.sh (two policy calls through the proxy), then the long tail, then
# the fix in half of the rollouts: groups have reward variance, so every step really trains
# and the policy version moves (with the fix always applied GSPO would skip every group)
AGENT = (
    (ROOT / "examples" / "agents" / "ask-twice.sh").read_text()
    + """
if [ $((RANDOM % 10)) -eq 0 ]; then sleep 10; else sleep 1; fi
[ $((RANDOM % 2)) -eq 0 ] && exit 0
case "$LEGORL_INSTANCE_ID" in
__CASES__
esac
"""
)


def write_run(root: Path, args: argparse.Namespace, max_staleness: int) -> Path:
    cases = "\n".join(
        f"{t.instance_id}) git apply <<'PATCH'\n{t.patch.rstrip()}\nPATCH\n;;" for t in load_shipped("train")
    )
    (root / "agent.sh").write_text(AGENT.replace("__CASES__", cases))
    cfg = root / f"run{max_staleness}.toml"
    cfg.write_text(f"""
[run]
dir = "run{max_staleness}"
tasks = "shipped"
split = "train"
steps = {args.steps}
tasks_per_step = {args.tasks_per_step}
group_size = {args.group_size}
max_concurrent_rollouts = {args.tasks_per_step * args.group_size}
max_staleness = {max_staleness}
[engine]
kind = "hf"
model = "tiny-qwen3"
seed = 0
[proxy]
max_tokens = 16
[sandbox]
agent_timeout_s = 120
[harness]
name = "command"
command_file = "agent.sh"
[trainer]
model = "tiny-qwen3"
lr = 1e-5
old_logprobs = "rollout"
keep_checkpoints = 1
""")
    return cfg


def figures(run_dir: Path, wall_s: float) -> dict[str, Any]:
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        m: dict[str, list[float]] = {}
        for key, value in db.execute("SELECT key, value FROM metrics WHERE step >= 0 ORDER BY step"):
            m.setdefault(key, []).append(value)
        n = db.execute("SELECT count(*) FROM trajectories WHERE step >= 0 AND status IS NOT NULL").fetchone()[0]
    idle = sum(m.get("async/trainer_idle_s", [])) if "async/trainer_idle_s" in m else sum(m["time/rollout_s"])
    return {
        "rollouts": n,
        "gspo_wall_s": round(wall_s, 1),
        "rollouts_per_min": round(60 * n / wall_s, 1),
        "trainer_idle_fraction": round(idle / wall_s, 3),
        "staleness_max": max(m.get("async/staleness_max", [0])),
        "dropped_stale": sum(m.get("async/dropped_stale", [0])),
        "train_sync_s_mean": round(sum(m["time/train_sync_s"]) / len(m["time/train_sync_s"]), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="legorl-bench-async-"))
    out: dict[str, Any] = {"cores": os.cpu_count(), "load_before": os.getloadavg(), "modes": {}}
    for k in (0, 1):
        cfg = load_run_config(write_run(root, args, k))
        t0 = time.monotonic()
        asyncio.run(train(cfg, console=Console(stderr=True, quiet=True)))
        out["modes"]["synchronous" if k == 0 else "max_staleness=1"] = figures(cfg.run.dir, time.monotonic() - t0)
    sync, asyn = out["modes"]["synchronous"], out["modes"]["max_staleness=1"]
    out["speedup_rollouts_per_min"] = round(asyn["rollouts_per_min"] / sync["rollouts_per_min"], 2)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
