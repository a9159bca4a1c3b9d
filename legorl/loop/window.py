"""The pre-flight's window check: does each harness's native first prompt fit the policy?

A native harness opens every conversation with its own system prompt and tool list: ~6k
tokens for Claude Code, ~10-12k for OpenCode, OpenHands and Codex in a small BPE. A policy
whose window cannot hold that prompt would fail every rollout with a context refusal, and
the run would spend its hour evaluating and training on nothing but `context_exceeded`. So
before anything is spent, each harness the run uses plays one training task against a probe
engine that records the prompt it is sent (rendered by the policy's own tokenizer and chat
template, exactly as the run will render it) and answers with a one-word final text, and
the run is refused when the prompt plus one turn's `max_tokens` exceeds the window, naming
the harness, the measured length and the window.

The probe's rollout is real (sandbox, harness, proxy) but ungraded by anyone: it is not
stored, and it costs one harness start per harness (seconds; ~15 s for OpenHands). Its child
processes' CPU is that start's cost, which the load check reads (`loop/harness_load.py`).
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from legorl.engine.base import collect
from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.types import FinishReason, Generation, SamplingParams, Task, TokenStep

UNBOUNDED = 2**31


class PromptProbe:
    """An engine that answers "Done." and remembers the longest prompt it was sent."""

    name = "prompt-probe"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.policy_version = 0
        self.max_context = UNBOUNDED
        self.longest = 0
        self._answer = tokenizer.encode("Done.", add_special_tokens=False) + [tokenizer.eos_token_id]

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        self.longest = max(self.longest, len(prompt_ids))
        for tok in self._answer:
            yield TokenStep(tok, 0.0)
        yield TokenStep(None, None, FinishReason.STOP)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def close(self) -> None:
        return None


@dataclass(frozen=True)
class FirstPrompt:
    """What one harness's probe rollout measured."""

    tokens: int  # its first prompt (0 when it never asked the model)
    cpu_s: float  # its child processes' CPU: the harness's start, one prompt and one reply


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


async def first_prompt(cfg: RunConfig, tokenizer: Any, task: Task, harness: str) -> FirstPrompt:
    """`harness`'s first prompt on `task`, and what starting it cost."""
    from legorl.loop.worker import RolloutWorker

    probe = PromptProbe(tokenizer)
    roomy = cfg.model_copy(
        update={
            "proxy": cfg.proxy.model_copy(update={"max_context": UNBOUNDED}),
            "harness": cfg.harness.model_copy(update={"mix": {}, "name": harness, "max_turns": 1}),
            "sandbox": cfg.sandbox.model_copy(update={"retries": 0}),
        }
    )
    async with RolloutWorker(roomy, probe) as worker:
        with contextlib.suppress(Exception):  # an unbuildable task: the rollout records it as such
            await worker.images.for_task(task)  # built first: a first build's git runs are not the harness's
        # the sandbox's processes are counted when the zygote that forked them is waited for,
        # which the worker's exit does
        cpu0 = children_cpu_s()
        await worker.rollout(task, session_id=f"window-probe-{harness}")
    return FirstPrompt(probe.longest, children_cpu_s() - cpu0)


async def check_windows(cfg: RunConfig, tokenizer: Any, task: Task, window: int) -> dict[str, FirstPrompt]:
    """Each harness's first prompt; RunError for the first that does not fit."""
    out: dict[str, FirstPrompt] = {}
    for name in cfg.harness.names():
        if name == "command":  # the user's own script: it may never call the model
            continue
        fp = await first_prompt(cfg, tokenizer, task, name)
        out[name] = fp
        n = fp.tokens
        if n and n + cfg.proxy.max_tokens > window:
            raise RunError(
                f"pre-flight: harness {name!r} opens with a {n}-token prompt (its native system prompt and "
                f"tools, in {cfg.engine.model!r}'s tokenizer); with proxy.max_tokens = {cfg.proxy.max_tokens} "
                f"that exceeds the policy's {window}-token window. Choose a policy with a longer window"
            )
    return out
