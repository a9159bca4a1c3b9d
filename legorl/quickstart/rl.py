"""The RL phase: GSPO on graded episodes, through the project's trainer.

One step: `tasks_per_step` training tasks × `group_size` episodes each, played by the
current policy in one process (`inproc.run_episodes`: mini-swe-agent's messages from the
same YAML, real commands in real directories, every episode graded by a fresh test run),
assembled into `Trajectory`s from the recorded turns, and handed to
`legorl.train.trainer.Trainer.step` — group-normalised advantages, packed micro-batches of
the recorded ids, recomputed logprobs, the GSPO loss with its sequence ratio, AdamW.

The trainer's model *is* the sampling model (one copy of the weights, no sync needed in
process); only its attention kernel is switched: `legorl_varlen` for packed training rows,
`sdpa` for the left-padded sampling batches.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from legorl.proxy.render import Renderer
from legorl.quickstart.family import QuickTask
from legorl.quickstart.inproc import Episode, run_episodes
from legorl.train.config import TrainerConfig
from legorl.train.trainer import Trainer
from legorl.trajectory import assemble
from legorl.types import Trajectory

SAMPLE_ATTN, TRAIN_ATTN = "sdpa", "legorl_varlen"


def set_attention(lm: torch.nn.Module, name: str) -> None:
    if getattr(lm.config, "_attn_implementation", None) != name:
        lm.set_attn_implementation(name)


def trajectory_of(e: Episode, step: int) -> Trajectory:
    traj = assemble(e.turns, e.session_id)
    traj.instance_id = e.task_id
    traj.harness = "mini-swe-agent (in-process)"
    traj.step = step
    traj.outcome = e.outcome
    return traj


def make_trainer(lm: torch.nn.Module, lr: float, optimizer_state: dict[str, Any] | None, seed: int) -> Trainer:
    """A GSPO trainer around `lm`; with `optimizer_state` (from SFT) Adam starts calibrated."""
    from legorl.train import varlen

    varlen.register()
    cfg = TrainerConfig(
        model="(in-process)", loss="gspo", lr=lr, betas=(0.9, 0.99), seed=seed, temperature=1.0,
        sequence_unit="trajectory", zero_variance_groups="skip", max_grad_norm=1.0,
        attn_implementation=TRAIN_ATTN, max_tokens_per_microbatch=16384,
    )  # fmt: skip
    trainer = Trainer(cfg, lm=lm)
    if optimizer_state is not None:
        trainer.optimizer.load_state_dict(optimizer_state)
        for g in trainer.optimizer.param_groups:
            g["lr"] = lr
            g["betas"] = cfg.betas
    return trainer


def rl_step(
    trainer: Trainer,
    tasks: Sequence[QuickTask],
    group_size: int,
    make_episode: Callable[[QuickTask], Episode],
    renderer: Renderer,
    *,
    temperature: float,
    max_tokens: int,
    generator: torch.Generator,
    step: int,
) -> tuple[list[Episode], list[Trajectory], dict[str, float]]:
    """Roll out, grade, train once. Returns the episodes, their trajectories and metrics."""
    lm = trainer.lm
    t0 = time.perf_counter()
    set_attention(lm, SAMPLE_ATTN)
    lm.eval()
    episodes = [make_episode(t) for t in tasks for _ in range(group_size)]
    run_episodes(
        episodes, renderer, model=lm, temperature=temperature, max_tokens=max_tokens,
        generator=generator, policy_version=trainer.version,
    )  # fmt: skip
    t1 = time.perf_counter()
    trajs = [trajectory_of(e, step) for e in episodes]
    set_attention(lm, TRAIN_ATTN)
    lm.train()
    metrics = trainer.step(trajs)
    set_attention(lm, SAMPLE_ATTN)
    lm.eval()
    metrics["time/rollout_s"] = t1 - t0
    metrics["time/train_s"] = time.perf_counter() - t1
    metrics["reward/resolved_rate"] = sum(e.resolved for e in episodes) / len(episodes)
    return episodes, trajs, metrics


def task_stream(train: Sequence[QuickTask], seed: int) -> Callable[[int], list[QuickTask]]:
    """`take(n)`: the next n training tasks, reshuffled each pass over the pool."""
    rng = random.Random(seed)
    pool: list[QuickTask] = []

    def take(n: int) -> list[QuickTask]:
        nonlocal pool
        while len(pool) < n:
            fresh = list(train)
            rng.shuffle(fresh)
            pool += fresh
        out, pool = pool[:n], pool[n:]
        return out

    return take
