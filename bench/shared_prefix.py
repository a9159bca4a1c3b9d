"""Shared-prefix packing against today's packing, on harness-shaped groups. Prints one JSON.

A group of G rollouts of one task inside a native harness shares its whole first prompt (the
harness's system prompt and tool list, then the task): `prefix` tokens, then each rollout's
own `branch` tokens (completions and tool outputs). One trainer forward + backward over such a
micro-batch with `packing = "packed"` (every segment alone) and with `"shared_prefix"` (the
prefix once, branches on its KV cache), alternated in one process for `--rounds` rounds
(A, B, A, B, ...), median and spread reported per row. Also per row: trainer tokens computed
(packed: every token of every segment; shared: the prefix once plus the branches) and the
peak resident memory of each call (VmHWM, reset before it through /proc/self/clear_refs).

    .venv/bin/python bench/shared_prefix.py [--model harness-qwen3] [--rounds 3]
        [--shapes 6000x8,6000x16,20000x8,6000x8x8] [--statement 600] [--branch 500,2000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch


def peak_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def peak_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def batch(prefix: int, tasks: int, branches: int, statement: int, lo: int, hi: int, vocab: int, seed: int) -> Any:
    """`tasks` GSPO groups of `branches` rollouts: one harness prompt of `prefix` tokens for
    all, then (with more than one task) each task's `statement` tokens, then each rollout's own."""
    from legorl.train.batch import pack
    from legorl.types import AlignmentStats, Segment, Trajectory

    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(prefix)]
    trajs = []
    for t in range(tasks):
        task = [rng.randrange(3, vocab) for _ in range(statement if tasks > 1 else 0)]
        for b in range(branches):
            own = [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))]
            mask = [0] * (prefix + len(task)) + [1 if (i // 64) % 2 == 0 else 0 for i in range(len(own))]
            ids = shared + task + own  # turns and tool outputs alternate in `own`
            seg = Segment([0], ids, mask, [0.0] * len(ids), [0])
            trajs.append(Trajectory(f"t{t}b{b}", [seg], AlignmentStats(), instance_id=f"task{t}"))
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 1 << 30)
    return mb


def step(policy: Any, mb: Any, packing: str) -> tuple[float, float, int]:
    """One forward + backward: seconds, peak GB, and the tokens the decoder computed."""
    from legorl.train.logprobs import LogprobOptions

    computed: list[int] = []
    hook = policy.lm.get_decoder().register_forward_hook(
        lambda m, a, kw, out: computed.append(
            int((kw.get("input_ids") if kw.get("input_ids") is not None else kw["inputs_embeds"]).shape[1])
        ),
        with_kwargs=True,
    )
    policy.zero_grad(set_to_none=True)
    peak_reset()
    t0 = time.perf_counter()
    out = policy(mb, LogprobOptions(packing=packing))
    (out.logprobs_N * mb.mask_N).sum().backward()
    seconds = time.perf_counter() - t0
    hook.remove()
    return seconds, peak_gb(), sum(computed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="harness-qwen3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--shapes",
        default="6000x8,6000x16,20000x8,6000x8x8",
        help="prefix x branches, or prefix x tasks x branches (GSPO groups with their own statements), comma-separated",
    )
    ap.add_argument("--statement", type=int, default=600, help="a task statement's tokens (prefix x tasks x branches)")
    ap.add_argument("--branch", default="500,2000", help="branch length range lo,hi")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from legorl.models import resolve_model
    from legorl.train import varlen
    from legorl.train.logprobs import PolicyModel

    torch.set_num_threads(args.threads)
    lm = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), attn_implementation=varlen.register())
    policy = PolicyModel(lm)
    lo, hi = (int(x) for x in args.branch.split(","))
    vocab = int(lm.config.vocab_size)
    rows = []
    load_before = os.getloadavg()
    for shape in args.shapes.split(","):
        dims = [int(x) for x in shape.split("x")]
        prefix, tasks, branches = (dims[0], 1, dims[1]) if len(dims) == 2 else dims
        mb = batch(prefix, tasks, branches, args.statement, lo, hi, vocab, seed=prefix + tasks * branches)
        computed: dict[str, int] = {}
        times: dict[str, list[float]] = {"packed": [], "shared_prefix": []}
        peaks: dict[str, list[float]] = {"packed": [], "shared_prefix": []}
        step(policy, mb, "shared_prefix")  # warm-up: allocator, thread pools
        for _ in range(args.rounds):
            for packing in ("packed", "shared_prefix"):  # interleaved: A, B, A, B, ...
                s, gb, computed[packing] = step(policy, mb, packing)
                times[packing].append(s)
                peaks[packing].append(gb)
        row: dict[str, Any] = {"prefix": prefix, "tasks": tasks, "branches": branches, "branch_tokens": [lo, hi]}
        if tasks > 1:
            row["statement_tokens"] = args.statement
        for packing in times:
            row[packing] = {
                "tokens_computed": computed[packing],
                "step_s_median": round(statistics.median(times[packing]), 3),
                "step_s_spread": [round(min(times[packing]), 3), round(max(times[packing]), 3)],
                "peak_rss_gb_median": round(statistics.median(peaks[packing]), 3),
            }
        row["speedup"] = round(row["packed"]["step_s_median"] / row["shared_prefix"]["step_s_median"], 2)
        row["fewer_tokens"] = round(computed["packed"] / computed["shared_prefix"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        json.dumps(
            {
                "bench": "shared_prefix",
                "model": args.model,
                "rounds": args.rounds,
                "threads": args.threads,
                "rows": rows,
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
