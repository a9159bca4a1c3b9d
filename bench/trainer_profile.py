"""Where a GSPO trainer step's time goes: step time with the fp32 LM head on and off, and a
torch.profiler table per model, printed as one JSON object.

Why: on one H200 the trainer step ran at 0.64× (dense) / 0.39× (MoE) the naive HF step
(bench/trainer.py), while on CPU it is faster; the fp32 LM head (fp32 matmuls over every
sampled row x the vocabulary) and the MoE routing capture/replay are the suspects. This
measures both on the same models and inputs as bench/trainer.py (its probe configs and
synthetic trajectories). The profiler tables go to `--table-file` (flushed per model, so a
run cut short keeps what it measured) and their top rows into the JSON.

    python bench/trainer_profile.py                     # CPU sizes (the probe's small ones)
    python bench/trainer_profile.py --size gpu --table-file $OUT/profile.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trainer as tb  # noqa: E402 - bench/trainer.py: probe configs, synthetic trajectories

from legorl.train import varlen  # noqa: E402
from legorl.train.config import TrainerConfig  # noqa: E402
from legorl.train.trainer import Trainer  # noqa: E402


def top_ops(prof: profile, key: str, n: int) -> list[dict]:
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:n]
    return [{"op": e.key, "ms": round(getattr(e, key) / 1000, 2), "calls": e.count} for e in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", choices=["cpu", "gpu"], default=None)
    ap.add_argument("--kinds", default="dense,moe")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--table-file", default="", help="write the full profiler tables here")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    small = (args.size or ("gpu" if cuda else "cpu")) == "cpu"
    B, T = (2, 64) if small else (8, 2048)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    out: dict = {"device": args.device, "size": "cpu" if small else "gpu", "B": B, "T": T, "rows": []}
    table = open(args.table_file, "w") if args.table_file else None
    for kind in args.kinds.split(","):
        for head_fp32 in (True, False):
            torch.manual_seed(0)
            m = (
                AutoModelForCausalLM.from_config(
                    tb.probe_config(kind, small), dtype=torch.bfloat16, attn_implementation=varlen.register()
                )
                .to(args.device)
                .train()
            )
            cfg = TrainerConfig(
                device=args.device,
                dtype="bfloat16",
                lr=1e-6,
                logprob_chunk=4096,
                max_tokens_per_microbatch=B * T,
                lm_head_fp32=head_fp32,
                attn_implementation=varlen.NAME,
            )
            trainer = Trainer(cfg, lm=m)
            trajs = tb.synthetic(m, B, T, seed=0)
            for _ in range(2):
                trainer.step(trajs)
            times = []
            for _ in range(args.steps):
                tb.sync(args.device)
                t0 = time.perf_counter()
                trainer.step(trajs)
                tb.sync(args.device)
                times.append(time.perf_counter() - t0)
            row = {
                "kind": kind,
                "lm_head_fp32": head_fp32,
                "step_s": round(sorted(times)[len(times) // 2], 4),
                "tokens_per_s": round(B * T / sorted(times)[len(times) // 2]),
            }
            if head_fp32:
                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                with profile(activities=acts) as prof:
                    trainer.step(trajs)
                    tb.sync(args.device)
                row["top_ops"] = top_ops(prof, key, 12)
                if table is not None:
                    table.write(f"== {kind}, by {key}\n{prof.key_averages().table(sort_by=key, row_limit=30)}\n")
                    table.flush()
            out["rows"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)  # progress, in case the run is cut short
            del trainer, m
            if cuda:
                torch.cuda.empty_cache()
    if table is not None:
        table.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
