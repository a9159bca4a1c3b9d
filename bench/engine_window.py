"""The `hf` engine on a windowed-only model under a Claude-Code-shaped load: the batch cut to the
window (`BatchedForward.keep`) against every column kept, interleaved A/B.

The paper-table policy (harness-qwen3) has only sliding-window layers (256 back), while each
Claude Code rollout carries a ~6.4k-token prompt. `sessions` sessions of `turns` short turns
(`max_tokens` sampled tokens each, then a 0.3-1.3 s tool pause and `tool_tokens` more prompt
tokens) run `concurrency` at once over one shared prompt, so requests join and leave the batch
all the time. Each round runs `full` (every column kept: the mask bounds the window) and
`window` (rows cut to the window) on fresh engines with the same seeds and schedule, in
alternating order. Prints one JSON object: per arm, wall seconds, forward calls, decode steps,
sampled tokens per second and the median turn latency of every round, and their median and
spread (max - min).

    .venv/bin/python bench/engine_window.py [--sessions 32] [--concurrency 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time

import torch

from legorl.engine.hf import HFEngine
from legorl.types import SamplingParams


async def one_run(args: argparse.Namespace, keep_window: bool) -> dict:
    """One arm: every session's turns to the end; wall, forward calls, throughput."""
    engine = HFEngine(
        args.model, max_batch_size=64, max_context=32768, prefix_cache_tokens=524288, num_threads=args.threads, seed=0
    )
    if not keep_window:
        engine._fwd.keep = None  # every column kept, the mask alone bounds the window
    gen, pauses = torch.Generator().manual_seed(0), random.Random(0)
    shared = torch.randint(3, 4000, (args.prompt_tokens,), generator=gen).tolist()
    own = [
        torch.randint(3, 4000, (20 + args.turns * args.tool_tokens,), generator=gen).tolist()
        for _ in range(args.sessions)
    ]
    waits = [[0.3 + pauses.random() for _ in range(args.turns)] for _ in range(args.sessions)]
    sem = asyncio.Semaphore(args.concurrency)
    latencies: list[float] = []
    sampled = 0

    async def session(i: int) -> None:
        nonlocal sampled
        async with sem:
            prompt = shared + own[i][:20]
            for turn in range(args.turns):
                t0 = time.perf_counter()
                params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=7 * i + turn)
                g = await engine.generate(prompt, params)
                latencies.append(time.perf_counter() - t0)
                sampled += len(g.completion_ids)
                await asyncio.sleep(waits[i][turn])
                start = 20 + turn * args.tool_tokens
                prompt = prompt + list(g.completion_ids) + own[i][start : start + args.tool_tokens]

    t0 = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(args.sessions)))
    wall = time.perf_counter() - t0
    stats = dict(engine.stats)
    await engine.close()
    return {
        "wall_s": round(wall, 1),
        "forward_calls": stats["forward_calls"],
        "decode_steps": stats["decode_steps"],
        "sampled_tokens": sampled,
        "tokens_per_s": round(sampled / wall, 2),
        "turn_s_p50": round(statistics.median(latencies), 2),
        "reused_tokens": stats["reused_tokens"],
    }


def summary(runs: list[dict]) -> dict:
    """Median and spread (max - min) of each figure over the rounds."""
    out: dict = {"runs": runs}
    for key in ("wall_s", "forward_calls", "tokens_per_s", "turn_s_p50"):
        values = [r[key] for r in runs]
        out[key] = {"median": statistics.median(values), "spread": round(max(values) - min(values), 2)}
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="harness-qwen3")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=30)
    ap.add_argument("--prompt-tokens", type=int, default=6380)
    ap.add_argument("--tool-tokens", type=int, default=70)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"full": [], "window": []}
    for r in range(args.rounds):
        for arm in ("full", "window") if r % 2 == 0 else ("window", "full"):
            runs[arm].append(await one_run(args, keep_window=arm == "window"))
    out = {"bench": "engine_window", "args": vars(args), "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()}
    out |= {arm: summary(rs) for arm, rs in runs.items()}
    out["speedup_wall"] = round(out["full"]["wall_s"]["median"] / out["window"]["wall_s"]["median"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
