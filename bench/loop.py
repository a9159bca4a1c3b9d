"""Where a training step's wall time goes, in-process and on Ray (1 and 2 worker actors).

Runs `--steps` steps of the real loop (`legorl.loop.train` helpers: the tiny hf engine, the
command harness, local sandboxes, GSPO, in-process weight sync) once per backend:
`inproc` (one RolloutWorker in the driver) and `ray1`, `ray2` (RolloutActors on a local
Ray cluster, the driver's engine served to them over the vLLM protocol). Per step it
measures, from timestamps collected during the step:

- wall split: `rollout_s` (all groups, agent stages and grading overlapped), `store_s`
  (run store + advantages), `train_s` (the optimizer step), `sync_s` (weights → engine);
  `grading_busy_s` (wall time with >= 1 grade running) and `grading_tail_s` (from the last
  agent stage's end to the end of the rollout phase: grading nothing overlaps);
- `rollouts_per_min` over the whole step and over the rollout phase;
- utilisation over the step: `sandbox_busy` / `engine_busy` = fraction of the step's wall
  time with >= 1 sandbox (agent stage or grade) / >= 1 engine request in flight (from the
  proxy's turn start/end times), and the same over the rollout phase only.

The first step also builds task images and warms caches; `mean_after_first` excludes it.
`setup_s` is the backend's start (Ray cluster + actors + their proxies). One JSON object.

    .venv/bin/python bench/loop.py [--steps 4] [--tasks-per-step 2] [--group-size 4] [--modes inproc,ray1,ray2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from legorl.engine.registry import make_engine
from legorl.loop.config import RunConfig
from legorl.loop.train import build_trainer, record, rollout_backend, sample_tasks
from legorl.loop.worker import RolloutRecord
from legorl.models import load_tokenizer
from legorl.monitor.store import RunStore
from legorl.tasks.loader import load_shipped
from legorl.train.advantages import compute_advantages

AGENT = """#!/bin/bash
# Asks the policy twice through the proxy (OpenAI dialect), then applies the known fix, so
# every rollout has an agent stage with engine calls and a grading stage (same work each step).
python3 - <<'PY'
import json, os, urllib.request
base = os.environ["OPENAI_BASE_URL"]
msgs = [{"role": "user", "content": open(os.environ["LEGORL_PROBLEM_FILE"]).read()[:400]}]
for _ in range(2):
    body = {"model": "policy", "messages": msgs, "max_tokens": 64}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    reply = json.load(urllib.request.urlopen(req, timeout=300))
    msgs += [reply["choices"][0]["message"], {"role": "user", "content": "continue"}]
PY
case "$LEGORL_INSTANCE_ID" in
__CASES__
esac
"""


def agent_script() -> str:
    """AGENT with the gold patch of every training task, picked by the task's instance id."""
    cases = []
    for i, t in enumerate(load_shipped("train")):
        patch = t.patch if t.patch.endswith("\n") else t.patch + "\n"
        cases.append(f"{t.instance_id}) git apply <<'PATCH{i}'\n{patch}PATCH{i}\n;;")
    return AGENT.replace("__CASES__", "\n".join(cases))


def union(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of intervals, clipped to [lo, hi]."""
    spans = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, end = 0.0, lo
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def stamp(worker: Any) -> None:
    """Give the in-process worker's records the wall-clock start/end the Ray actors stamp."""
    inner = worker.rollout

    async def rollout(task: Any, **kw: Any) -> RolloutRecord:
        t0 = time.time()
        rec = await inner(task, **kw)
        rec.timings.update(t_start=t0, t_end=time.time())
        return rec

    worker.rollout = rollout


def step_figures(records: list[RolloutRecord], t: list[float]) -> dict[str, float]:
    """t = wall-clock [start, rollouts done, stored, trained, synced]."""
    agent, grading, engine = [], [], []
    for r in records:
        end, g, a = r.timings["t_end"], r.timings.get("grade_s", 0.0), r.timings.get("agent_s", 0.0)
        grading.append((end - g, end))
        agent.append((end - g - a, end - g))
        engine += [(turn.t_start, turn.t_end) for turn in r.turns]
    wall, roll = t[4] - t[0], t[1] - t[0]
    last_agent = max((b for _, b in agent), default=t[0])
    return {
        "wall_s": wall, "rollout_s": roll, "store_s": t[2] - t[1], "train_s": t[3] - t[2], "sync_s": t[4] - t[3],
        "grading_busy_s": union(grading, t[0], t[1]), "grading_tail_s": max(t[1] - last_agent, 0.0),
        "rollouts": len(records), "rollouts_per_min": 60 * len(records) / wall,
        "rollouts_per_min_rollout_phase": 60 * len(records) / roll,
        "sandbox_busy": union(agent + grading, t[0], t[4]) / wall, "engine_busy": union(engine, t[0], t[4]) / wall,
        "sandbox_busy_rollout_phase": union(agent + grading, t[0], t[1]) / roll,
        "engine_busy_rollout_phase": union(engine, t[0], t[1]) / roll,
        "turns": sum(len(r.turns) for r in records),
    }  # fmt: skip


async def run_mode(cfg: RunConfig) -> dict[str, Any]:
    tokenizer = load_tokenizer(cfg.engine.model)
    engine = make_engine(cfg.engine, tokenizer)
    trainer = build_trainer(cfg, engine)
    store = RunStore(cfg.run.dir, run_name=cfg.run.dir.name)
    tasks = load_shipped(cfg.run.split)
    limit = asyncio.Semaphore(cfg.run.max_concurrent_rollouts)
    steps: list[dict[str, float]] = []
    try:
        t_setup = time.time()
        async with rollout_backend(cfg, engine) as backend:
            setup_s = time.time() - t_setup
            if not cfg.ray.enabled:
                stamp(backend)
            for step in range(cfg.run.steps):
                t = [time.time()]
                store.begin_step(step, policy_version=trainer.version)
                batch = sample_tasks(tasks, cfg.run.tasks_per_step, cfg.run.seed, step)
                groups = await asyncio.gather(*(backend.group(x, cfg.run.group_size, step=step, limit=limit) for x in batch))
                records = [r for g in groups for r in g]
                t.append(time.time())
                record(store, records, tokenizer)
                trajs = [r.trajectory for r in records]
                adv = compute_advantages(trajs, eps=trainer.cfg.advantage_eps, zero_variance=trainer.cfg.zero_variance_groups)
                store.set_advantages({x.session_id: a for x, a in zip(trajs, adv.values) if a is not None})
                t.append(time.time())
                await asyncio.to_thread(trainer.step, trajs, data_state={"next_step": step + 1})
                t.append(time.time())
                await trainer.sync_weights()
                t.append(time.time())
                store.end_step(step)
                fig = step_figures(records, t)
                fig["statuses"] = sorted({r.trajectory.outcome.status.value for r in records})  # type: ignore[assignment]
                steps.append(fig)
    finally:
        await engine.close()
        store.close()
    later = steps[1:] or steps
    keys = [k for k, v in steps[0].items() if isinstance(v, float | int)]
    mean = {k: round(sum(s[k] for s in later) / len(later), 3) for k in keys}
    return {"setup_s": round(setup_s, 2), "steps": [{k: (round(v, 3) if isinstance(v, float) else v)
                                                     for k, v in s.items()} for s in steps], "mean_after_first": mean}


def config(mode: str, root: Path, args: argparse.Namespace) -> RunConfig:
    workers = int(mode[3:]) if mode.startswith("ray") else 1
    return RunConfig.model_validate({
        "run": {"dir": str(root / mode), "tasks": "shipped", "split": "train", "steps": args.steps,
                "tasks_per_step": args.tasks_per_step, "group_size": args.group_size,
                "max_concurrent_rollouts": args.tasks_per_step * args.group_size},
        "engine": {"kind": "hf", "model": "tiny-qwen3", "seed": 0},
        "proxy": {"max_tokens": args.max_tokens},
        "sandbox": {"agent_timeout_s": 300},
        "harness": {"name": "command", "command_file": str(root / "agent.sh")},
        "trainer": {"lr": 1e-4, "zero_variance_groups": "keep", "checkpoint_dir": str(root / mode / "checkpoints"), "checkpoint_every": 1000},
        "ray": {"enabled": mode.startswith("ray"), "workers": workers, "num_cpus_per_worker": 0.5},
    })  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tasks-per-step", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=24, help="completion tokens per engine call")
    p.add_argument("--modes", default="inproc,ray1,ray2")
    args = p.parse_args()
    out: dict[str, Any] = {
        "workload": {"steps": args.steps, "tasks_per_step": args.tasks_per_step, "group_size": args.group_size,
                     "engine": "hf tiny-qwen3 (CPU), served to Ray actors over the vLLM protocol",
                     "harness": "command: 2 chat calls, then the gold patch (every rollout is graded)",
                     "max_tokens": args.max_tokens, "sandbox": "local"},
        "machine": {"cores": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "modes": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="legorl-bench-loop-") as tmp:
        root = Path(tmp)
        (root / "agent.sh").write_text(agent_script())
        for mode in args.modes.split(","):
            out["modes"][mode] = asyncio.run(run_mode(config(mode, root, args)))
    out["machine"]["loadavg_end"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
