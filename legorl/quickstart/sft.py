"""Warm start: supervised fine-tuning on the expert's recorded trajectories.

The data are `Trajectory`s assembled from the turns the proxy recorded while the real
mini-swe-agent ran against the scripted expert: the exact prompt ids the engine saw and
the exact completion ids it returned, nothing re-tokenised. The loss is the mean negative
log-likelihood of the sampled (loss-mask 1) tokens — the same packed micro-batches and the
same chunked log-prob head (`legorl.train.batch.pack`, `legorl.train.logprobs.PolicyModel`)
the GSPO trainer uses, so SFT and RL read a trajectory identically.

Every demonstration is imitated, right or wrong: the expert is imperfect on purpose (see
expert.py) and filtering its episodes by outcome would already be a form of RL.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from legorl.train.batch import pack
from legorl.train.logprobs import LogprobOptions, PolicyModel
from legorl.train.schedule import warmup_cosine_lr
from legorl.types import Trajectory


@dataclass
class SFTConfig:
    steps: int = 200
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 0


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up, then cosine decay to `min_lr_ratio` of the peak."""
    return warmup_cosine_lr(cfg.lr, step, cfg.warmup_steps, cfg.steps, floor=cfg.min_lr_ratio)


def sft(
    policy: PolicyModel,
    data: Sequence[Trajectory],
    cfg: SFTConfig,
    *,
    optimizer_state: dict[str, Any] | None = None,
    log: Callable[[int, dict[str, float]], None] | None = None,
    log_every: int = 25,
) -> torch.optim.Optimizer:
    """Train `policy` on `data` for `cfg.steps` steps; returns the optimizer (its state
    carries over to the RL phase, so RL starts with calibrated Adam moments).
    `optimizer_state` continues an earlier run's AdamW moments (the SFT control)."""
    if not data:
        raise ValueError("SFT needs at least one trajectory")
    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    if optimizer_state is not None:
        opt.load_state_dict(optimizer_state)
    opts = LogprobOptions()
    order: list[int] = []
    policy.train()
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        if len(order) < cfg.batch_size:
            fresh = list(range(len(data)))
            rng.shuffle(fresh)
            order += fresh
        batch, order = order[: cfg.batch_size], order[cfg.batch_size :]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        mbs = pack([(i, data[i], 1.0) for i in batch], "trajectory", max_tokens=1 << 30)
        tokens = sum(float(mb.mask_N.sum()) for mb in mbs)
        loss_sum = 0.0
        for mb in mbs:
            out = policy(mb, opts)
            loss = -(out.logprobs_N * mb.mask_N).sum() / tokens
            loss.backward()
            loss_sum += float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm))
        opt.step()
        if log is not None and (step % log_every == 0 or step == cfg.steps - 1):
            log(step, {"sft/loss": loss_sum, "sft/grad_norm": grad_norm, "sft/lr": lr_at(step, cfg),
                       "sft/elapsed_s": time.perf_counter() - t0})  # fmt: skip
    return opt
