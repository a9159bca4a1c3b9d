"""Logprob parity between the trainer's recompute and what an engine sampled: a correlation and
a recorded two-turn engine session (tests/train/test_train_logprobs.py, test_train_families.py)."""

from __future__ import annotations

import torch

from legorl.trajectory import assemble
from legorl.types import Dialect, SamplingParams, Turn


def pearson(a, b):
    return float(torch.corrcoef(torch.stack([a.double(), b.double()]))[0, 1])


async def engine_session(engine, g, session, temperature):
    """A two-turn session through the real engine, recorded as the proxy records turns."""
    params = SamplingParams(temperature=temperature, max_tokens=10)
    prompt = torch.randint(3, 4096, (9,), generator=g).tolist()
    turns = []
    for index in range(2):
        gen = await engine.generate(prompt, params)
        turns.append(
            Turn(
                session,
                index,
                Dialect.OPENAI_CHAT,
                list(prompt),
                gen.completion_ids,
                gen.logprobs,
                gen.finish_reason,
                params.to_dict(),
                routed_experts=gen.routed_experts,
                policy_version=engine.policy_version,
            )
        )
        prompt = prompt + gen.completion_ids + torch.randint(3, 4096, (5,), generator=g).tolist()
    return assemble(turns)
