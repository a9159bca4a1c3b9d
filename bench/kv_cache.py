"""Decode seconds per step of the `hf` engine's batch: transformers' concatenating cache
layer against our in-place `GrowingLayer`, side by side on the same model and batch.

Every decode step of `DynamicLayer` copies the whole cache (`torch.cat`); `GrowingLayer`
writes one column into a buffer with spare columns. The two are run alternately, `--repeat`
times each, on one prefilled batch of `--rows` prompts of about `--columns` tokens, so a busy
machine slows both alike. Prints one JSON object (median and min s/step, and the ratio).

    .venv/bin/python bench/kv_cache.py --model smollm2-135m-instruct --rows 32 --columns 600
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from transformers.cache_utils import DynamicLayer

from legorl.engine.hf import load_model
from legorl.engine.kv_batch import BatchedForward, GrowingLayer, KVBatch


def with_layers(batch: KVBatch, kind: type[DynamicLayer]) -> KVBatch:
    """A copy of `batch` whose full-attention layers are `kind` (`DynamicLayer`: transformers'
    concatenating one; `GrowingLayer`: the engine's), holding the same keys and values."""
    out = copy.copy(batch.cache)
    out.layers = []
    for layer in batch.cache.layers:
        if isinstance(layer, DynamicLayer):
            fresh = kind()
            fresh.update(layer.keys.clone(), layer.values.clone())
            out.layers.append(fresh)
        else:
            out.layers.append(copy.deepcopy(layer))
    out.layer_class_to_replicate = None
    return KVBatch(out, batch.valid_B_S.clone())


def time_steps(fwd: BatchedForward, batch: KVBatch, lengths: list[int], steps: int) -> float:
    tokens = [1] * batch.rows
    t0 = time.perf_counter()
    for k in range(steps):
        fwd.decode(batch, tokens, [n + k for n in lengths])
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--columns", type=int, default=600)
    ap.add_argument("--steps", type=int, default=16, help="decode steps per timing")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    model = load_model(args.model, "cpu", "float32", "sdpa")
    fwd = BatchedForward(model)
    vocab = int(model.get_input_embeddings().num_embeddings)  # the bundled tiny models have 512 ids
    prompts = [[(r * 7 + j) % vocab for j in range(args.columns - r % 16)] for r in range(args.rows)]
    t0 = time.perf_counter()
    base, _ = fwd.prefill(prompts)
    prefill_s = time.perf_counter() - t0
    lengths = [len(p) for p in prompts]
    times: dict[str, list[float]] = {"concatenating": [], "growing": []}
    for _ in range(args.repeat):
        times["concatenating"].append(time_steps(fwd, with_layers(base, DynamicLayer), lengths, args.steps))
        times["growing"].append(time_steps(fwd, with_layers(base, GrowingLayer), lengths, args.steps))
    out = {
        "model": args.model,
        "rows": args.rows,
        "columns": args.columns,
        "threads": args.threads,
        "prefill_tokens_per_s": round(sum(lengths) / prefill_s, 1),
        **{
            f"{k}_s_per_step": {"median": round(statistics.median(v), 4), "min": round(min(v), 4)}
            for k, v in times.items()
        },
        "speedup_median": round(statistics.median(times["concatenating"]) / statistics.median(times["growing"]), 2),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
