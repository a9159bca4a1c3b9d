"""The pre-flight's time-budget check: will this run fit `[run] time_budget_s` at the speed
this machine actually has? Said at start-up, before the first rollout spends the hour.

Two speeds are measured on the run's own trainer and engine, best of two calls (the first
pays one-off costs): the trainer's forward + backward tokens/s (one micro-batch; the
gradients are thrown away, the weights untouched) and, on a CPU engine, its prefill
tokens/s (one prompt). The work is a *lower bound* on
what the config asks for: every trajectory holds at least its first prompt (the task's
problem statement in the model's chat template, `p0` tokens), so each trained trajectory
or demonstration costs at least `p0` trained tokens (at most the reach + 1 of a windowed
policy, whose unseen head is not trained: train/receptive_field.py) and each rollout at least `p0`
prefilled ones. A run whose lower bound exceeds the budget cannot fit: refused with what
to shrink. (A GPU engine batches prefill, so only the trainer's share bounds it there.)
The estimate is printed either way. It is only a floor (a run that uses its turns costs
several times more), so a run that passes can still overrun; one that fails cannot fit.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

from legorl.compute_thread import in_own_thread
from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.types import SamplingParams


@dataclass
class Budget:
    p0: int  # tokens of the smallest prompt a rollout can have
    train_tps: float  # trainer forward+backward tokens/s
    prefill_tps: float | None  # engine prefill tokens/s (CPU engines only)
    trained_tokens: int  # lower bound
    prefilled_tokens: int  # lower bound
    lower_s: float

    def line(self, budget_s: float) -> str:
        speed = f"trainer {self.train_tps:.0f} tokens/s" + (
            f", engine prefill {self.prefill_tps:.0f} tokens/s" if self.prefill_tps else ""
        )
        return (
            f"time budget {budget_s:.0f}s: at the measured speed ({speed}) this run needs at least "
            f"{self.lower_s:.0f}s ({self.trained_tokens} trained + {self.prefilled_tokens} prefilled tokens of "
            f">= {self.p0}-token prompts)"
        )


def first_prompt_tokens(tokenizer: Any, statement: str) -> int:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": statement}], add_generation_prompt=True, tokenize=False
    )
    return len(tokenizer.encode(text, add_special_tokens=False))


def trainer_tokens_per_s(trainer: Any, n: int) -> float:
    """Forward + backward of one n-token micro-batch (every target sampled), gradients discarded."""
    import torch

    from legorl.train.batch import pack
    from legorl.types import AlignmentStats, Segment, Trajectory

    vocab = trainer.lm.get_input_embeddings().weight.shape[0]
    rng = random.Random(0)
    ids = [rng.randrange(3, vocab) for _ in range(n)]
    seg = Segment([0], ids, [0] + [1] * (n - 1), [0.0] * n, [0])
    (mb,) = pack([(0, Trajectory("budget", [seg], AlignmentStats(), instance_id="budget"), 1.0)], "trajectory", n + 1)
    mb = mb.to(trainer.device)
    t0 = time.perf_counter()
    out = trainer.policy(mb, trainer.opts)
    out.logprobs_N.sum().backward()
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    trainer.optimizer.zero_grad(set_to_none=True)
    return n / max(seconds, 1e-9)


async def engine_prefill_tokens_per_s(engine: Any, n: int, vocab: int) -> float:
    rng = random.Random(1)
    prompt = [rng.randrange(3, vocab) for _ in range(n)]
    t0 = time.perf_counter()
    await asyncio.wait_for(engine.generate(prompt, SamplingParams(max_tokens=1, temperature=1.0, seed=0)), 300)
    return n / max(time.perf_counter() - t0, 1e-9)


async def check_budget(cfg: RunConfig, trainer: Any, engine: Any, tokenizer: Any, statement: str) -> Budget | None:
    """The estimate (None without a budget); RunError when even its lower bound is over."""
    budget = cfg.run.time_budget_s
    if budget is None or trainer.dist.world > 1:  # under torchrun one rank alone cannot run a forward
        return None
    r, ws, h = cfg.run, cfg.warm_start, cfg.heldout
    p0 = first_prompt_tokens(tokenizer, statement)
    n = max(16, min(512, cfg.trainer.max_tokens_per_microbatch - 1))  # small calls understate throughput
    # best of two: the first call pays one-off costs (thread pools, allocator, lazy init)
    train_tps = max([await in_own_thread(trainer_tokens_per_s, trainer, n) for _ in range(2)])
    prefill_tps = None
    if cfg.engine.kind == "hf" and cfg.engine.device == "cpu":
        vocab = trainer.lm.get_input_embeddings().weight.shape[0]
        room = int(getattr(engine, "max_context", 0) or n + 2) - 2
        prefill_tps = max([await engine_prefill_tokens_per_s(engine, max(1, min(n, room)), vocab) for _ in range(2)])
    gspo = r.steps * r.tasks_per_step * r.group_size
    sft = (ws.steps * ws.batch_size if ws.episodes else 0) + ws.control_steps * ws.batch_size
    evals = h.tasks * (len(h.at) + (1 if ws.control_steps else 0))
    receptive = trainer.policy.receptive  # a windowed policy trains at most this much before its first sample
    trained_p0 = p0 if receptive is None else min(p0, receptive + 1)
    trained, prefilled = (gspo + sft) * trained_p0, (gspo + evals) * p0
    lower = trained / train_tps + (prefilled / prefill_tps if prefill_tps else 0.0)
    est = Budget(p0, train_tps, prefill_tps, trained, prefilled, lower)
    if lower > budget:
        raise RunError(
            est.line(budget).replace("this run needs", "this run cannot fit: it needs")
            + ": lower run.steps, heldout.tasks or warm_start.steps, or raise run.time_budget_s"
        )
    return est
