"""Throughput of the one loop with a real harness: where a rollout's time and CPU go.

Runs the quickstart's own loop (`examples/quickstart.toml`: the warm mini-swe-agent,
local sandboxes from the cached task images, the `hf` engine with the 0.46M quickstart
model behind the proxy, grading by legorl.verify in fresh sandboxes, the run store, GSPO)
through the same functions `legorl train` calls: a short warm start first (so the policy
acts like a trained one: run the tests, fix, submit, get graded — an untrained model only
makes format errors, which would be a flattering, meaningless throughput), then
`--steps` GSPO steps. Per step: rollouts/min over the rollout phase, and per rollout

- `sandbox_start_s`: the agent sandbox's start (cached image, backend warm);
- `startup_s`: sandbox start → the harness's first model request (the issue's "start-up");
- `model_s`: wall time inside model calls (proxy + engine), summed over the turns;
- `command_s`: wall time of its commands in the sandbox;
- `grade_s`: grading (fresh sandbox, apply, pytest);
- `harness_s`: the whole agent stage; `diff_s`: extracting the diff;

and where the machine's CPU went during the GSPO steps (from /proc: this process — proxy,
engine, trainer, store —, the mini-swe-agent driver, and the rest: sandboxes, their
commands, the zygote, grading's git and pytest), per rollout. One JSON object.

    .venv/bin/python bench/loop.py [--steps 4] [--config examples/quickstart.toml] [--ray-workers N]

(with `--ray-workers`, the driver's CPU is inside "rest": the actors are other processes)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from legorl.engine.registry import make_engine
from legorl.harness.base import HostHarness
from legorl.loop.config import load_run_config
from legorl.loop.phases import gspo_step, warm_start
from legorl.loop.report import Report
from legorl.loop.run import Run
from legorl.loop.startup import build_trainer, load_task_split, rollout_backend
from legorl.loop.worker import RolloutRecord
from legorl.models import load_tokenizer
from legorl.store.run_store import RunStore

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int | str = "self") -> float:
    """CPU seconds (user + system) of a process and its reaped children."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in f[11:15]) / TICK


def machine_cpu() -> float:
    """CPU seconds the whole machine spent busy (all cores)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(x) for x in Path("/proc/stat").read_text().split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / TICK


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def per_rollout(recs: list[RolloutRecord]) -> dict[str, dict[str, float]]:
    rows: dict[str, list[float]] = {}
    for r in recs:
        t = dict(r.timings)
        turns = sorted((x for x in r.turns if not x.side_call), key=lambda x: x.t_start)
        if turns and "t_harness_start" in t:
            t["startup_s"] = turns[0].t_start - t["t_harness_start"]
        t["model_s"] = sum(x.t_end - x.t_start for x in turns)
        t.pop("t_harness_start", None)
        for k, v in t.items():
            rows.setdefault(k, []).append(v)
    return {
        k: {
            "p50": round(statistics.median(v), 4),
            "p90": round(pct(v, 0.9), 4),
            "mean": round(statistics.fmean(v), 4),
            "n": len(v),
        }
        for k, v in sorted(rows.items())
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    cfg = load_run_config(args.config)
    root = Path(tempfile.mkdtemp(prefix="legorl-bench-loop-"))
    cfg.run.dir = root / "run"
    cfg.run.steps = args.steps
    cfg.warm_start.episodes, cfg.warm_start.steps, cfg.warm_start.control_steps = args.demos, args.sft_steps, 0
    if args.ray_workers:
        cfg.ray.enabled, cfg.ray.workers = True, args.ray_workers
    cfg.run.dir.mkdir(parents=True)
    tasks = load_task_split(cfg, cfg.run.split)
    tok = load_tokenizer(cfg.engine.model)
    store = RunStore(cfg.run.dir, run_name="bench-loop")
    engine = make_engine(cfg.engine, tok)
    trainer = build_trainer(cfg, engine)
    out: dict[str, Any] = {
        "config": str(args.config),
        "harness": cfg.harness.name,
        "backend": cfg.sandbox.backend,
        "model": cfg.engine.model,
        "cores": os.cpu_count(),
        "load_before": os.getloadavg(),
        "steps": [],
    }
    recs: list[RolloutRecord] = []

    class CountingRun(Run):  # the step's rollouts, as the loop stores them
        def on_record(self, rec: RolloutRecord) -> None:
            super().on_record(rec)
            recs.append(rec)

    run = CountingRun(cfg, trainer, tasks, [], store, Report(cfg.run.dir), tok, Console(quiet=True))
    try:
        t0 = time.monotonic()
        await warm_start(run)
        out["warm_start_s"] = round(time.monotonic() - t0, 1)
        t_up = time.monotonic()
        async with rollout_backend(cfg, engine) as worker:  # one in-process worker, or Ray actors
            run.worker = worker
            out["worker_start_s"] = round(time.monotonic() - t_up, 2)
            harness = getattr(worker, "harness", None)  # in-process: its driver's CPU is counted apart
            proc = harness.driver.proc if isinstance(harness, HostHarness) else None
            driver = proc.pid if proc is not None else None
            cpu = {"main": 0.0, "driver": 0.0, "rest": 0.0, "machine": 0.0}
            wall = 0.0
            for step in range(cfg.run.steps):
                recs.clear()
                c0 = (machine_cpu(), proc_cpu(), proc_cpu(driver) if driver else 0.0)
                m = await gspo_step(run, step)
                c1 = (machine_cpu(), proc_cpu(), proc_cpu(driver) if driver else 0.0)
                d_machine, d_main, d_driver = c1[0] - c0[0], c1[1] - c0[1], c1[2] - c0[2]
                if step > 0:  # the first step warms caches (task images, the engine's kernels)
                    cpu["machine"] += d_machine
                    cpu["main"] += d_main
                    cpu["driver"] += d_driver
                    cpu["rest"] += d_machine - d_main - d_driver
                    wall += m["time/step_s"]
                out["steps"].append(
                    {
                        "rollouts": len(recs),
                        "rollout_s": round(m["time/rollout_s"], 2),
                        "train_sync_s": round(m["time/train_sync_s"], 2),
                        "rollouts_per_min": round(m["rollout/rollouts_per_min"], 1),
                        "rollouts_per_min_whole_step": round(60 * len(recs) / m["time/step_s"], 1),
                        "resolved_rate": round(m["resolved_rate"], 3),
                        "per_rollout": per_rollout(recs),
                        "statuses": dict(Counter(r.trajectory.outcome.status.value for r in recs)),
                        "cpu_s": {
                            "machine": round(d_machine, 1),
                            "main": round(d_main, 1),
                            "driver": round(d_driver, 1),
                        },
                    }
                )
            later = out["steps"][1:] or out["steps"]
            n = sum(s["rollouts"] for s in later)
            out["mean_after_first"] = {
                "rollouts_per_min": round(statistics.fmean(s["rollouts_per_min"] for s in later), 1),
                "rollouts_per_min_whole_step": round(
                    statistics.fmean(s["rollouts_per_min_whole_step"] for s in later), 1
                ),
                "cpu_s_per_rollout": {k: round(v / max(n, 1), 4) for k, v in cpu.items()},
                "machine_cpu_utilisation": round(cpu["machine"] / max(wall, 1e-9) / (os.cpu_count() or 1), 3),
            }
    finally:
        await engine.close()
        store.close()
    out["load_after"] = os.getloadavg()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.toml")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--demos", type=int, default=384, help="warm-start demonstrations (expert, through the loop)")
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument("--ray-workers", type=int, default=0, help="rollouts on N Ray actors (0: in process)")
    args = p.parse_args()
    print(json.dumps(asyncio.run(bench(args)), indent=1))


if __name__ == "__main__":
    main()
