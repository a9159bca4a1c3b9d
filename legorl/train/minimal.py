"""The whole RL loop in one file: sample a group per prompt, reward, GSPO step, repeat.

A toy task that a random-init tiny model can learn on a CPU within a minute: the reward of
a completion is the fraction of its tokens that lie in a target set (the first
`target_tokens` ids above the special tokens; about 6% of the vocabulary at init). Each
step takes `prompts_per_step` prompts (random ids, a deterministic function of the data
position), samples `group_size` completions of each with the reference sampler, builds one
single-segment Trajectory per completion (prompt tokens masked out of the loss), and calls
`Trainer.step`. It is also the process the resume test kills: the data position lives in
the checkpoint, so a restarted run continues with exactly the prompts, samples and updates
an uninterrupted run would have made.

    python -m legorl.train.minimal --steps 20 --lr 3e-3 [--checkpoint-dir D] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

from legorl.train.config import TrainerConfig
from legorl.train.sampler import sample
from legorl.train.trainer import Trainer
from legorl.types import AlignmentStats, Outcome, Segment, Status, Trajectory

FIRST_ID = 3  # ids 0-2 are special tokens in the bundled tokenizer


def toy_reward(completion_ids: list[int], target_tokens: int) -> float:
    hits = sum(FIRST_ID <= t < FIRST_ID + target_tokens for t in completion_ids)
    return hits / max(len(completion_ids), 1)


def prompt_for(position: int, length: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + position)
    return torch.randint(FIRST_ID, vocab, (length,), generator=g).tolist()


def rollouts(trainer: Trainer, position: int, args: argparse.Namespace) -> tuple[list[Trajectory], float]:
    lm = trainer.lm
    vocab = lm.get_input_embeddings().weight.shape[0]
    trajs, rewards = [], []
    for p in range(args.prompts_per_step):
        prompt = prompt_for(position + p, args.prompt_len, vocab, args.seed)
        samples = sample(lm, [prompt] * args.group_size, max_new_tokens=args.new_tokens,
                         temperature=trainer.cfg.temperature, lm_head_fp32=trainer.cfg.lm_head_fp32)  # fmt: skip
        for g, s in enumerate(samples):
            reward = toy_reward(s.completion_ids, args.target_tokens)
            rewards.append(reward)
            seg = Segment(
                turn_indices=[0], token_ids=prompt + s.completion_ids,
                loss_mask=[0] * len(prompt) + [1] * len(s.completion_ids),
                logprobs=[0.0] * len(prompt) + s.logprobs,
                policy_versions=[trainer.version], routed_experts=s.routed_experts,
            )  # fmt: skip
            trajs.append(Trajectory(f"{position + p}-{g}", [seg], AlignmentStats(), instance_id=f"prompt-{position + p}",
                                    step=trainer.step_count, outcome=Outcome(reward, Status.RESOLVED)))  # fmt: skip
    return trajs, sum(rewards) / len(rewards)


def params_digest(lm: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(lm.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--steps", type=int, default=20, help="total steps of the run (a resumed run counts the old ones)")
    ap.add_argument("--lr", type=float, default=3e-3)
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
    cfg = TrainerConfig(model=args.model, lr=args.lr, loss=args.loss, temperature=args.temperature, seed=args.seed,
                        checkpoint_dir=args.checkpoint_dir, max_grad_norm=1.0)  # fmt: skip
    trainer = Trainer(cfg)
    if args.checkpoint_dir and any(Path(args.checkpoint_dir).glob("step_*")):
        trainer.load_checkpoint(args.checkpoint_dir)
        print(f"resumed at step {trainer.step_count}", file=sys.stderr, flush=True)
    out = open(args.json, "a") if args.json else None
    while trainer.step_count < args.steps:
        position = int(trainer.data_state.get("position", 0))
        print(f"step {trainer.step_count} start", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        trajs, reward = rollouts(trainer, position, args)
        metrics = trainer.step(trajs, data_state={"position": position + args.prompts_per_step})
        row = {"step": trainer.step_count, "reward": reward, "loss": metrics.get("train/loss"),
               "params": params_digest(trainer.lm), "seconds": round(time.perf_counter() - t0, 3),
               **{k: v for k, v in metrics.items() if k.startswith(("train/", "groups/"))}}  # fmt: skip
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
