"""Generation throughput of the `hf` engine at concurrency 1 and 16 (dense and MoE).

Prints one JSON object: for each model and concurrency, completion tokens per second
over the wall time of `requests` requests (each a ~64-token chat prompt, up to
`max_tokens` sampled tokens at T = 1), plus decode steps and mean rows per step, which
show whether concurrent requests were really batched, and how late the asyncio event
loop (which serves the proxy) wakes up meanwhile.

    .venv/bin/python bench/engine_throughput.py [--max-tokens 64] [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from legorl.engine.hf import HFEngine
from legorl.types import SamplingParams


async def run(engine: HFEngine, prompt: list[int], concurrency: int, requests: int, max_tokens: int) -> dict:
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    sem = asyncio.Semaphore(concurrency)
    steps0, tokens0 = engine.stats["decode_steps"], engine.stats["tokens"]

    async def one(i: int) -> int:
        async with sem:
            g = await engine.generate(prompt, SamplingParams(**{**params.to_dict(), "seed": i}))
            return len(g.completion_ids)

    lag_ms: list[float] = []

    async def watch_loop() -> None:  # how late a 10 ms sleep wakes up: event-loop responsiveness
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            lag_ms.append((time.perf_counter() - t - 0.01) * 1000)

    watcher = asyncio.create_task(watch_loop())
    t0 = time.perf_counter()
    counts = await asyncio.gather(*[one(i) for i in range(requests)])
    wall = time.perf_counter() - t0
    watcher.cancel()
    steps = engine.stats["decode_steps"] - steps0
    return {
        "concurrency": concurrency,
        "requests": requests,
        "completion_tokens": sum(counts),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(sum(counts) / wall, 1),
        "decode_steps": steps,
        "mean_rows_per_step": round((engine.stats["tokens"] - tokens0) / max(steps, 1), 2),
        "event_loop_lag_ms_p50": round(sorted(lag_ms)[len(lag_ms) // 2], 2) if lag_ms else None,
        "event_loop_lag_ms_max": round(max(lag_ms), 2) if lag_ms else None,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default="tiny-qwen3,tiny-qwen3-moe")
    args = ap.parse_args()
    out: dict = {"bench": "engine_throughput", "device": args.device, "cpu_count": os.cpu_count(), "results": {}}
    for name in args.models.split(","):
        engine = HFEngine(name, device=args.device, seed=0)
        tok = engine.tokenizer
        text = "Please fix the failing test in utils/parse.py; the parser drops trailing commas. " * 2
        prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)["input_ids"]
        await run(engine, prompt, 4, 4, 8)  # warm-up
        out["prompt_tokens"] = len(prompt)
        out["num_threads"] = engine.num_threads
        out["results"][name] = [
            await run(engine, prompt, 1, 4, args.max_tokens),
            await run(engine, prompt, 16, 32, args.max_tokens),
        ]
        await engine.close()
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
