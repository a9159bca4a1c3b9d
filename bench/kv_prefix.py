"""Agent-shaped traffic through the `hf` engine with and without prefix reuse, side by side.

`--sessions` sessions run at once, each `--turns` turns: the first prompt is a shared system
prompt and a task of its own; every next prompt is the last one, its completion and a tool
output (`--observation` ids), as a harness re-sends its transcript. Without reuse every
turn prefills the whole transcript again; with it (`[engine] prefix_cache_tokens`, the
default) a turn copies the last turn's KV columns and prefills only what is new. Prints one
JSON object: wall seconds, prompt tokens, tokens reused, and the speed-up.

    .venv/bin/python bench/kv_prefix.py --model smollm2-135m-instruct --sessions 16 --turns 3

With `--reuse-only` and a harness's sizes (`--model harness-qwen3 --system 27000
--cache-tokens 524288`: Codex's first prompt) it times the reuse path alone, which is how the
engine's own bookkeeping (prefix matching, regrouping) is compared between two checkouts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from legorl.engine.hf import HFEngine
from legorl.types import SamplingParams


async def session(engine: HFEngine, system: list[int], s: int, args: argparse.Namespace) -> int:
    rng = random.Random(s)
    vocab = engine.vocab_size
    prompt = system + [rng.randrange(3, vocab) for _ in range(args.task)]
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=s)
    for _ in range(args.turns):
        g = await engine.generate(prompt, params)
        prompt = prompt + g.completion_ids + [rng.randrange(3, vocab) for _ in range(args.observation)]
    return len(prompt)


async def run(args: argparse.Namespace, cache_tokens: int) -> dict[str, float]:
    engine = HFEngine(args.model, seed=0, num_threads=args.threads, prefix_cache_tokens=cache_tokens)
    try:
        rng = random.Random(0)
        system = [rng.randrange(3, engine.vocab_size) for _ in range(args.system)]
        t0 = time.perf_counter()
        await asyncio.gather(*[session(engine, system, s, args) for s in range(args.sessions)])
        wall = time.perf_counter() - t0
    finally:
        await engine.close()
    return {
        "wall_s": round(wall, 1),
        "prompt_tokens": engine.stats["prompt_tokens"],
        "reused_tokens": engine.stats["reused_tokens"],
        "sampled_tokens": engine.stats["tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--system", type=int, default=250, help="shared system-prompt ids")
    ap.add_argument("--task", type=int, default=50, help="ids of each session's own task")
    ap.add_argument("--observation", type=int, default=60, help="tool-output ids appended per turn")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-tokens", type=int, default=32768, help="[engine] prefix_cache_tokens of the reuse side")
    ap.add_argument("--reuse-only", action="store_true", help="skip the side without reuse (a harness-length prompt)")
    args = ap.parse_args()
    off = None if args.reuse_only else asyncio.run(run(args, 0))
    on = asyncio.run(run(args, args.cache_tokens))
    out = {
        "bench": "kv_prefix",
        **{k: getattr(args, k) for k in ("model", "sessions", "turns", "system", "task", "observation", "threads")},
        "max_tokens": args.max_tokens,
        "cache_tokens": args.cache_tokens,
        "without_reuse": off,
        "with_reuse": on,
        "speedup": round(off["wall_s"] / on["wall_s"], 2) if off else None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
