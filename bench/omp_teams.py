"""Serving speed before and after trainer work in the same process, by how that work is run
off the event loop: `asyncio.to_thread` (an executor thread that stays) against `in_own_thread`
(legorl/compute_thread.py: a thread that ends with the work). Prints one JSON object.

Each trial is a fresh process (a kept OpenMP team cannot be undone within one): an in-process
`hf` engine serves a harness-shaped load (CONCURRENCY sessions at a time, each three turns on a
PREFIX-token shared prompt, 48 sampled tokens a turn) twice; then SFT steps (shared-prefix
packing, a group of 32 rollouts on the same prompt) and the weight copy into the engine run
through the arm's dispatch; then the same load twice more. Arms alternate over `--rounds`
(A, B, A, B, ...); per arm the median and spread of the wall-time ratio after/before, and of the
cores the engine used while serving (its process CPU over wall).

    .venv/bin/python bench/omp_teams.py [--rounds 3] [--sft-steps 5] [--model harness-qwen3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: `bench.shared_prefix`

PREFIX, CONCURRENCY, SESSIONS = 15000, 16, 96
ARMS = ("to_thread", "own_thread")


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def serve(engine: Any, seed: int) -> tuple[float, float]:
    """Wall seconds and process CPU-seconds of SESSIONS three-turn sessions."""
    from legorl.types import SamplingParams

    rng = random.Random(seed)
    vocab = engine.vocab_size
    shared = [rng.randrange(3, vocab) for _ in range(PREFIX)]
    gate = asyncio.Semaphore(CONCURRENCY)
    params = SamplingParams(temperature=1.0, max_tokens=48)

    async def session() -> None:
        async with gate:
            ids = shared + [rng.randrange(3, vocab) for _ in range(300)]
            for _ in range(3):
                gen = await engine.generate(ids, params)
                ids = ids + gen.completion_ids + [rng.randrange(3, vocab) for _ in range(150)]

    t0, c0 = time.perf_counter(), cpu_s()
    await asyncio.gather(*(session() for _ in range(SESSIONS)))
    return time.perf_counter() - t0, cpu_s() - c0


def sft(model: str, steps: int) -> dict[str, Any]:
    """`steps` SFT steps on one shared-prefix group; the weights for the engine."""
    import torch
    from transformers import AutoModelForCausalLM

    from bench.shared_prefix import batch
    from legorl.models import resolve_model
    from legorl.train import varlen
    from legorl.train.logprobs import LogprobOptions, PolicyModel

    lm = AutoModelForCausalLM.from_pretrained(resolve_model(model), attn_implementation=varlen.register())
    policy = PolicyModel(lm)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    mb = batch(PREFIX, 1, 32, 600, 300, 700, int(lm.config.vocab_size), seed=1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        out = policy(mb, LogprobOptions(packing="shared_prefix"))
        (-(out.logprobs_N * mb.mask_N).sum() / mb.mask_N.sum()).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in lm.state_dict().items()}


async def trial(arm: str, model: str, steps: int) -> dict[str, Any]:
    from legorl.compute_thread import in_own_thread
    from legorl.engine.hf import HFEngine

    dispatch = in_own_thread if arm == "own_thread" else asyncio.to_thread
    engine = HFEngine(model, max_batch_size=64, max_context=32768, num_threads=2, prefix_cache_tokens=524288, seed=0)
    try:
        await serve(engine, 99)  # warm-up: the allocator, the engine's team
        before = [await serve(engine, r) for r in range(2)]
        state = await dispatch(sft, model, steps)
        await dispatch(engine.load_state_dict, state, 1)
        after = [await serve(engine, r) for r in range(2)]
    finally:
        await engine.close()
    wall_b, wall_a = sum(w for w, _ in before), sum(w for w, _ in after)
    return {
        "arm": arm,
        "before_s": round(wall_b, 2),
        "after_s": round(wall_a, 2),
        "ratio": round(wall_a / wall_b, 3),
        "cores_before": round(sum(c for _, c in before) / wall_b, 2),
        "cores_after": round(sum(c for _, c in after) / wall_a, 2),
        "os_threads_after": len(os.listdir("/proc/self/task")),
    }


def spread(xs: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(xs), 3), "spread": [round(min(xs), 3), round(max(xs), 3)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sft-steps", type=int, default=5)
    ap.add_argument("--model", default="harness-qwen3")
    ap.add_argument("--trial", choices=ARMS, help=argparse.SUPPRESS)  # one trial, in this process
    args = ap.parse_args()
    if args.trial:
        print(json.dumps(asyncio.run(trial(args.trial, args.model, args.sft_steps))), flush=True)
        return
    load_before = os.getloadavg()
    trials: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for arm in ARMS:  # interleaved: A, B, A, B, ...
            cmd = [sys.executable, __file__, "--trial", arm, "--model", args.model, "--sft-steps", str(args.sft_steps)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
            trials.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(trials[-1]), file=sys.stderr, flush=True)
    arms = {
        arm: {k: spread([t[k] for t in trials if t["arm"] == arm]) for k in ("ratio", "cores_before", "cores_after")}
        | {"after_s": spread([t["after_s"] for t in trials if t["arm"] == arm])}
        for arm in ARMS
    }
    print(
        json.dumps(
            {
                "bench": "omp_teams",
                "model": args.model,
                "rounds": args.rounds,
                "sft_steps": args.sft_steps,
                "load": {"prefix": PREFIX, "concurrency": CONCURRENCY, "sessions": SESSIONS, "turns": 3},
                "arms": arms,
                "trials": trials,
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
