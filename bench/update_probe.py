"""How GSPO update settings move a finished run's policy, replayed offline; per step, as JSON.

Why: a paper-table run costs an hour, nearly all of it rollouts through the harness (the
trainer's update is ~4 s of a ~130 s step inside Claude Code). Whether a learning rate moves
the policy toward what the reward favours, or only shakes its tool-call format, can be seen
in minutes by replaying the run's own stored steps through the trainer. Starting from the
warm start (`RUN_DIR/control_start.pt`), the first `--train-steps` GSPO steps' trajectories
train in their order under each setting. After each update, the trajectories of the steps
after them, which no update saw, measure two things:

    adv_dlogp  mean over their sequences of Â · Δ(mean token log π): above 0 when the update
               raised, beyond its own batches, what won and lowered what lost
    kl_start   k3 KL(π ‖ π_start) per sampled token: how far everything moved. A converged
               SFT's format sits in these tokens, and it is what a too-large step breaks

The measured steps were sampled by the run's own later policies, so this compares settings;
it does not predict a held-out resolved rate.

    .venv/bin/python bench/update_probe.py RUN_DIR [--train-steps 6] \
        [--set lr=3e-4 --set lr=6e-4,kl_coef=0.5 --set lr=3e-4,minibatches=4,clip_high=0.05]

Each `--set` is one setting: `[trainer]` keys over the run's own stored `[trainer]` section.
"""

from __future__ import annotations

import argparse
import copy
import json
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from legorl.loop.run_dir import CONTROL_START_FILE
from legorl.store.run_store import RunStore
from legorl.train.advantages import Advantages
from legorl.train.batch import pack
from legorl.train.config import TrainerConfig
from legorl.train.logprobs import PolicyModel
from legorl.train.losses import k3_kl_N
from legorl.train.trainer import Trainer
from legorl.types import Trajectory

MEASURE_TOKENS = 400_000  # tokens per no-grad forward while measuring (shared prefixes count once)


def parse_setting(text: str) -> dict[str, Any]:
    """`lr=6e-4,kl_coef=0.5` → {"lr": "6e-4", "kl_coef": "0.5"}; the trainer's config types them."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--set {text!r}: expected key=value[,key=value], got {part!r}")
        out[key.strip()] = value.strip()
    return out


def trainer_config(base: dict[str, Any], setting: dict[str, Any]) -> TrainerConfig:
    """The run's `[trainer]` with `setting` over it, validated; no checkpoints are written."""
    unknown = sorted(set(setting) - set(TrainerConfig.model_fields))
    if unknown:
        raise ValueError(f"--set: {', '.join(unknown)} not a [trainer] key")
    return TrainerConfig.model_validate({**base, **setting, "checkpoint_dir": ""})


def measure(trainer: Trainer, start: PolicyModel, held: Sequence[Trajectory], adv: Advantages) -> dict[str, float]:
    """`adv_dlogp` and `kl_start` of `trainer`'s policy against the frozen `start` on `held` (see above)."""
    items = [(i, t, a) for i, (t, a) in enumerate(zip(held, adv.values, strict=True)) if a is not None]
    signal = seqs = kl = tokens = 0.0
    with torch.no_grad():
        for mb in pack(items, "trajectory", MEASURE_TOKENS, receptive=trainer.policy.receptive):
            now_N = trainer.policy(mb, trainer.opts).logprobs_N
            was_N = start(mb, trainer.opts).logprobs_N
            mask_N, unit_N = mb.mask_N, mb.unit_ids_N
            kl += float((k3_kl_N(now_N, was_N) * mask_N).sum())
            tokens += float(mask_N.sum())
            units = int(unit_N.max()) + 1
            count_U = torch.zeros(units).index_add_(0, unit_N, mask_N)
            dlogp_U = torch.zeros(units).index_add_(0, unit_N, (now_N - was_N) * mask_N) / count_U.clamp(min=1)
            adv_U = torch.zeros(units).index_add_(0, unit_N, mb.advantages_N * mask_N) / count_U.clamp(min=1)
            signal += float((adv_U * dlogp_U).sum())
            seqs += float((count_U > 0).sum())
    return {"adv_dlogp": signal / seqs if seqs else 0.0, "kl_start": kl / tokens if tokens else 0.0}


def probe(
    cfg: TrainerConfig,
    start_state: dict[str, torch.Tensor],
    batches: Sequence[Sequence[Trajectory]],
    held: Sequence[Trajectory],
) -> list[dict[str, float]]:
    """One row per training batch: the update's own metrics and `measure` after it."""
    trainer = Trainer(cfg)
    trainer.lm.load_state_dict(start_state)
    start = copy.deepcopy(trainer.policy).eval().requires_grad_(False)
    if cfg.kl_coef > 0:
        trainer.set_reference()
    adv = trainer.advantages(held)
    rows = []
    for batch in batches:
        t0 = time.perf_counter()
        m = trainer.step(list(batch), checkpoint=False)
        row = {"update_s": round(time.perf_counter() - t0, 2)}
        row.update({k: round(v, 5) for k, v in measure(trainer, start, held, adv).items()})
        for key in ("train/grad_norm", "train/clip_frac", "train/seq_ratio_min", "train/seq_ratio_max"):
            if key in m:
                row[key] = round(m[key], 5)
        rows.append(row)
    return rows


def _steps(store: RunStore, path: Path) -> dict[int, list[Trajectory]]:
    """The run's GSPO steps (≥ 0), each its trajectories in the order they were stored."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT step, session_id FROM trajectories WHERE step >= 0 ORDER BY step, id").fetchall()
    out: dict[int, list[Trajectory]] = {}
    for step, sid in rows:
        traj = store.load_trajectory(sid)
        if traj is not None:
            out.setdefault(step, []).append(traj)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--train-steps", type=int, default=6, help="GSPO steps replayed as updates; the rest measure")
    ap.add_argument("--set", action="append", default=[], help="one setting: key=value[,key=value] of [trainer]")
    args = ap.parse_args(argv)
    db, start_file = args.run_dir / "run.sqlite", args.run_dir / CONTROL_START_FILE
    for need in (db, start_file):
        if not need.exists():
            print(
                f"update_probe: {need} not found: RUN_DIR must be a run that warm-started and trained", file=sys.stderr
            )
            return 2
    store = RunStore(db, readonly=True)
    base = store.run_info()["config"]
    try:
        settings = [parse_setting(s) for s in (args.set or ["lr=" + str(base.get("trainer", {}).get("lr", 1e-6))])]
        cfgs = [trainer_config(base.get("trainer", {}), s) for s in settings]
    except (ValueError, ValidationError) as e:
        print(f"update_probe: {e}", file=sys.stderr)
        return 2
    steps = _steps(store, db)
    order = sorted(steps)
    if len(order) <= args.train_steps or args.train_steps < 1:
        print(
            f"update_probe: {len(order)} GSPO steps stored; --train-steps must be 1..{len(order) - 1}", file=sys.stderr
        )
        return 2
    batches = [steps[k] for k in order[: args.train_steps]]
    held = [t for k in order[args.train_steps :] for t in steps[k]]
    start_state = torch.load(start_file, map_location="cpu", weights_only=False)["lm"]
    report = {
        "bench": "update_probe",
        "run_dir": str(args.run_dir),
        "train_steps": order[: args.train_steps],
        "measured_steps": order[args.train_steps :],
        "settings": [
            {"set": s, "per_step": probe(c, start_state, batches, held)} for s, c in zip(settings, cfgs, strict=True)
        ],
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
