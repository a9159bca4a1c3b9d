"""The whole RL loop in one file: sample a group per prompt, reward, GSPO step, sync, repeat.

A toy task that a random-init tiny model can learn on a CPU within a minute: the reward of
a completion is the fraction of its tokens that lie in a target set (the first
`target_tokens` ids above the special tokens; about 6% of the vocabulary at init). Each
step takes `prompts_per_step` prompts (random ids, a deterministic function of the data
position), samples `group_size` completions of each with the reference sampler, builds one
single-segment Trajectory per completion (prompt tokens masked out of the loss), trains, and
pushes the new weights to the sampler (`InProcessSync`) as a real engine would get them.
It is also the process the resume test kills: the data position lives in the checkpoint,
so a restarted run continues with exactly the prompts, samples and updates an uninterrupted
run would have made.

    python -m legorl.train.minimal --steps 20 --lr 3e-2 [--checkpoint-dir D] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from legorl.train.config import TrainerConfig
from legorl.train.sampler import sample
from legorl.train.sync import InProcessSync
from legorl.train.trainer import Trainer, load_lm
from legorl.types import AlignmentStats, Outcome, Segment, Status, Trajectory

FIRST_ID = 3  # ids 0-2 are special tokens in the bundled tokenizer


def toy_reward(completion_ids: list[int], target_tokens: int) -> float:
    hits = sum(FIRST_ID <= t < FIRST_ID + target_tokens for t in completion_ids)
    return hits / max(len(completion_ids), 1)


def prompt_for(position: int, length: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + position)
    return torch.randint(FIRST_ID, vocab, (length,), generator=g).tolist()


class LocalSampler:
    """The minimal loop's engine: its own copy of the model, updated like an in-process engine."""

    def __init__(self, lm: nn.Module) -> None:
        self.lm = lm.eval()
        self.policy_version = 0

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.lm.load_state_dict(dict(state_dict), strict=True)
        self.policy_version = version


def rollouts(
    lm: nn.Module, position: int, args: argparse.Namespace, *, version: int = 0, temperature: float = 1.0
) -> tuple[list[Trajectory], float]:
    """One group of `group_size` samples for each of `prompts_per_step` prompts; mean reward."""
    vocab = lm.get_input_embeddings().weight.shape[0]
    trajs, rewards = [], []
    for p in range(args.prompts_per_step):
        prompt = prompt_for(position + p, args.prompt_len, vocab, args.seed)
        samples = sample(lm, [prompt] * args.group_size, max_new_tokens=args.new_tokens, temperature=temperature)
        for g, s in enumerate(samples):
            reward = toy_reward(s.completion_ids, args.target_tokens)
            rewards.append(reward)
            seg = Segment(
                turn_indices=[0],
                token_ids=prompt + s.completion_ids,
                loss_mask=[0] * len(prompt) + [1] * len(s.completion_ids),
                logprobs=[0.0] * len(prompt) + s.logprobs,
                policy_versions=[version],
                routed_experts=s.routed_experts,
            )
            outcome = Outcome(reward, Status.RESOLVED)
            trajs.append(
                Trajectory(
                    f"{position + p}-{g}",
                    [seg],
                    AlignmentStats(),
                    instance_id=f"prompt-{position + p}",
                    outcome=outcome,
                )
            )
    return trajs, sum(rewards) / len(rewards)


def params_digest(state_dict: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every parameter's name and bytes: equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name, t in sorted(state_dict.items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--steps", type=int, default=20, help="total steps of the run (a resumed run counts the old ones)")
    ap.add_argument("--lr", type=float, default=3e-2)
    ap.add_argument("--loss", default="gspo")
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--target-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    ap.add_argument("--checkpoint-dir", default="")
    ap.add_argument("--json", default="", help="append one JSON line per step to this file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainerConfig(
        model=args.model,
        lr=args.lr,
        loss=args.loss,
        temperature=args.temperature,
        seed=args.seed,
        checkpoint_dir=args.checkpoint_dir,
        max_grad_norm=1.0,
    )
    return asyncio.run(run(cfg, args))


async def run(cfg: TrainerConfig, args: argparse.Namespace) -> int:
    sampler = LocalSampler(load_lm(cfg.model_copy(update={"dtype": "float32"})))
    trainer = Trainer(cfg, weight_sync=InProcessSync(sampler))
    if args.checkpoint_dir and any(Path(args.checkpoint_dir).glob("step_*")):
        trainer.load_checkpoint(args.checkpoint_dir)
        await trainer.sync_weights()  # the sampler must sample from the restored weights
        print(f"resumed at step {trainer.step_count}", file=sys.stderr, flush=True)
    out = open(args.json, "a") if args.json else None
    try:
        await _loop(trainer, sampler, cfg, args, out)
    finally:
        if out:
            out.close()
    return 0


async def _loop(trainer: Trainer, sampler: LocalSampler, cfg: TrainerConfig, args: argparse.Namespace, out) -> None:
    while trainer.step_count < args.steps:
        position = int(trainer.data_state.get("position", 0))
        print(f"step {trainer.step_count} start", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        trajs, reward = rollouts(
            sampler.lm, position, args, version=sampler.policy_version, temperature=cfg.temperature
        )
        metrics = await trainer.train_step(trajs, data_state={"position": position + args.prompts_per_step})
        row = {
            "step": trainer.step_count,
            "reward": reward,
            "loss": metrics.get("train/loss"),
            "params": params_digest(trainer.state_dict_for_engines()),
            "seconds": round(time.perf_counter() - t0, 3),
            **{k: v for k, v in metrics.items() if k.startswith(("train/", "groups/"))},
        }
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    sys.exit(main())
