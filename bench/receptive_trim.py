"""A windowed policy's trainer step with and without its unseen head, on a run's own data.

Prints one JSON. `harness-qwen3` attends through two 256-token windows, so a sampled token's
logprob depends on the 512 tokens before it, not on the rest of a harness's 15-26k-token first
prompt (legorl/train/receptive_field.py). This bench takes a finished run's stored
trajectories (real harness prompts, real completions) and times, alternated in one process
for `--rounds` rounds (whole, trimmed, whole, trimmed, ...), median and spread per row:

- `sft`: one SFT step's forward and backward over `--batch` demonstrations (the run's
  warm-start trajectories, batches drawn as `legorl.train.sft` draws them);
- `gspo`: one GSPO step's forward and backward over a stored step's rollouts.

Both under the run's packing (`shared_prefix` in the paper-table configs, where a mixed batch
still computes each harness's prompt once). Per row also: tokens packed and tokens through the
decoder (a shared prefix counted once), and the largest
difference between the two arms' logprobs (per sampled token) and gradients (relative to the
largest gradient entry), which exactness should keep at float rounding.

    .venv/bin/python bench/receptive_trim.py examples/runs/paper-table/mixed [--rounds 5]
        [--batch 32] [--step 0] [--packing shared_prefix]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch


def trajectories(run_dir: Path, step: int) -> list[Any]:
    """The unmasked, sampled-from trajectories the store holds for `step`."""
    from legorl.store.run_store import RunStore

    with RunStore(run_dir / "run.sqlite", readonly=True) as store:
        with store._read() as c:  # noqa: SLF001 (a bench reading its own store)
            ids = [r[0] for r in c.execute("SELECT session_id FROM trajectories WHERE step=? ORDER BY id", (step,))]
        out = [store.load_trajectory(s) for s in ids]
    return [
        t
        for t in out
        if t is not None and t.segments and t.outcome is not None and not t.outcome.masked
        if any(any(s.loss_mask[1:]) for s in t.segments)
    ]


def policy_for(run_dir: Path) -> Any:
    """The run's last checkpoint (or the random-init policy) in the trainer's own attention."""
    from legorl.train.config import TrainerConfig
    from legorl.train.logprobs import PolicyModel
    from legorl.train.trainer import load_lm

    steps = sorted((run_dir / "checkpoints").glob("step_*/model"))
    lm = load_lm(TrainerConfig(model=str(steps[-1]) if steps else "harness-qwen3")).float()
    return PolicyModel(lm)


def one(policy: Any, items: list[tuple[int, Any, float]], packing: str, receptive: int | None) -> dict[str, Any]:
    """One forward + backward over `items`; seconds, tokens, per-trajectory sampled logprobs, grads."""
    from legorl.train.batch import pack
    from legorl.train.logprobs import LogprobOptions

    computed: list[int] = []  # tokens through the decoder, call by call (a shared prefix once)
    hook = policy.lm.get_decoder().register_forward_hook(
        lambda m, a, kw, out: computed.append(int(kw.get("input_ids", kw.get("inputs_embeds")).shape[1])),
        with_kwargs=True,
    )
    try:
        t0 = time.perf_counter()
        mbs = pack(items, "trajectory", 1 << 30, receptive=receptive)
        policy.zero_grad(set_to_none=True)
        sampled = sum(float(mb.mask_N.sum()) for mb in mbs)
        lps: dict[int, torch.Tensor] = {}
        for mb in mbs:
            out = policy(mb, LogprobOptions(packing=packing))
            (-(out.logprobs_N * mb.advantages_N * mb.mask_N).sum() / sampled).backward()
            for t in mb.traj_ids_N.unique().tolist():
                lps[t] = out.logprobs_N[(mb.traj_ids_N == t) & (mb.mask_N > 0)].detach()
        seconds = time.perf_counter() - t0
    finally:
        hook.remove()
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
    packed = sum(mb.num_tokens for mb in mbs)
    return {"s": seconds, "tokens": {"packed": packed, "computed": sum(computed)}, "lps": lps, "grads": grads}


def row(policy: Any, name: str, items: list[tuple[int, Any, float]], packing: str, rounds: int) -> dict[str, Any]:
    arms: dict[str, list[float]] = {"whole": [], "trimmed": []}
    tokens: dict[str, dict[str, int]] = {}
    lp_diff = grad_diff = 0.0
    for _ in range(rounds):
        whole = one(policy, items, packing, None)
        trimmed = one(policy, items, packing, policy.receptive)
        arms["whole"].append(whole["s"])
        arms["trimmed"].append(trimmed["s"])
        tokens = {"whole": whole["tokens"], "trimmed": trimmed["tokens"]}
        for t, lp in whole["lps"].items():
            lp_diff = max(lp_diff, float((trimmed["lps"][t] - lp).abs().max()))
        scale = max(float(g.abs().max()) for g in whole["grads"].values())
        for n, g in whole["grads"].items():
            grad_diff = max(grad_diff, float((trimmed["grads"][n] - g).abs().max()) / scale)
    med = {k: statistics.median(v) for k, v in arms.items()}
    return {
        "row": name,
        "trajectories": len(items),
        "seconds": {
            k: {"median": round(med[k], 3), "min": round(min(v), 3), "max": round(max(v), 3)} for k, v in arms.items()
        },
        "speedup": round(med["whole"] / med["trimmed"], 2),
        "tokens": tokens,
        "max_abs_logprob_diff": lp_diff,
        "max_grad_diff_rel": grad_diff,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--step", type=int, default=0, help="the stored GSPO step to replay")
    ap.add_argument("--packing", default="shared_prefix", choices=["packed", "shared_prefix"])
    args = ap.parse_args()
    if not (args.run_dir / "run.sqlite").is_file():
        sys.exit(f"receptive_trim: no run.sqlite in {args.run_dir}")
    from legorl.store.phase_steps import WARM_START_STEP

    torch.set_num_threads(os.cpu_count() or 1)
    policy = policy_for(args.run_dir)
    if policy.receptive is None:
        sys.exit("receptive_trim: this run's policy is not windowed in every layer: nothing to trim")
    demos = trajectories(args.run_dir, WARM_START_STEP)
    rollouts = trajectories(args.run_dir, args.step)
    if len(demos) < args.batch or not rollouts:
        sys.exit(f"receptive_trim: {len(demos)} demonstrations, {len(rollouts)} rollouts at step {args.step}")
    pick = random.Random(0).sample(range(len(demos)), args.batch)  # one SFT batch
    rng = random.Random(1)
    sft_items = [(i, demos[k], 1.0) for i, k in enumerate(pick)]
    gspo_items = [(i, t, rng.choice([-1.0, 1.0])) for i, t in enumerate(rollouts)]
    load_before = os.getloadavg()
    rows = [
        row(policy, "sft", sft_items, args.packing, args.rounds),
        row(policy, "gspo", gspo_items, args.packing, args.rounds),
    ]
    harnesses = sorted({t.harness for t in demos})
    print(
        json.dumps(
            {
                "bench": "receptive_trim",
                "run_dir": str(args.run_dir),
                "receptive": policy.receptive,
                "packing": args.packing,
                "harnesses": harnesses,
                "rows": rows,
                "rounds": args.rounds,
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
