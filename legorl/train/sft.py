"""Warm start: supervised fine-tuning on recorded demonstration trajectories.

The data are `Trajectory`s assembled from the turns the proxy recorded while a harness
ran against a demonstrator engine (`[warm_start]`, legorl/loop/warm_start.py): the exact
prompt ids the engine saw and the exact completion ids it returned, nothing re-tokenised. The loss is the mean negative
log-likelihood of the sampled (loss-mask 1) tokens — the same packed micro-batches and the
same chunked log-prob head (`legorl.train.batch.pack`, `legorl.train.logprobs.PolicyModel`)
the GSPO trainer uses, so SFT and RL read a trajectory identically.

It steps the trainer's own AdamW (its moments carry over into GSPO, so RL starts with a
calibrated optimizer) under its own warm-up + cosine schedule, and puts the trainer's
learning rates back afterwards.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    optimizer: torch.optim.Optimizer,
    *,
    log: Callable[[int, dict[str, float]], None] | None = None,
    log_every: int = 25,
    opts: LogprobOptions | None = None,
    max_tokens: int = 1 << 30,
) -> dict[str, float]:
    """Train `policy` on `data` for `cfg.steps` steps of `optimizer`; returns the last
    logged metrics. The optimizer's learning rates are restored at the end.

    `max_tokens` is the micro-batch budget (the trainer passes its own
    `max_tokens_per_microbatch`): a batch of demonstrations is packed into as many
    micro-batches as that takes, their gradients summed, so activation memory is bounded by
    one micro-batch, as in a GSPO step, not by the whole batch. Gradients are freed after
    the last step (set to None), not kept until the next phase zeroes them."""
    if not data:
        raise ValueError("SFT needs at least one demonstration trajectory")
    rng = random.Random(cfg.seed)
    opt = optimizer
    saved_lrs = [g["lr"] for g in opt.param_groups]
    opts = opts or LogprobOptions()
    last: dict[str, float] = {}
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
        mbs = pack([(i, data[i], 1.0) for i in batch], "trajectory", max_tokens=max_tokens, receptive=policy.receptive)
        tokens = sum(float(mb.mask_N.sum()) for mb in mbs)
        loss_sum = 0.0
        for mb in mbs:
            out = policy(mb, opts)
            loss = -(out.logprobs_N * mb.mask_N).sum() / tokens
            loss.backward()
            loss_sum += float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm))
        opt.step()
        if step % log_every == 0 or step == cfg.steps - 1:
            last = {
                "sft/loss": loss_sum,
                "sft/grad_norm": grad_norm,
                "sft/lr": lr_at(step, cfg),
                "sft/elapsed_s": time.perf_counter() - t0,
            }
            if log is not None:
                log(step, last)
    opt.zero_grad(set_to_none=True)
    for g, lr in zip(opt.param_groups, saved_lrs, strict=True):
        g["lr"] = lr
    return last
