"""Lockstep batched sampling: hundreds of episodes' turns in one forward pass per token.

`sample_batch` advances many prompts at once through one left-padded KV cache (the `hf`
engine's `BatchedForward`) and draws every token from the exact distribution
`legorl.engine.sampling` defines, returning each token's log-probability — what the proxy
records for a turn. The in-process episode runner uses it because every episode of a
round is at the same turn: one batch, no scheduler, no HTTP. The real-harness path uses
the `hf` engine itself (continuous batching behind the proxy), with the same kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from legorl.engine.kv_batch import BatchedForward
from legorl.engine.sampling import processed_logprobs, sample
from legorl.types import FinishReason


@dataclass
class Sampled:
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason


@torch.no_grad()
def sample_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    temperature: float,
    max_tokens: int | list[int],
    eos_ids: frozenset[int],
    generator: torch.Generator,
    chunk: int = 256,
) -> list[Sampled]:
    """Sample one completion per prompt (at most `max_tokens`, one cap or one per prompt);
    all rows advance together, `chunk` rows at a time."""
    caps = list(max_tokens) if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    if len(caps) != len(prompts) or min(caps, default=1) < 1:
        raise ValueError("max_tokens: one cap >= 1 per prompt")
    out: list[Sampled] = []
    for start in range(0, len(prompts), chunk):
        end = start + chunk
        out += _sample_chunk(model, prompts[start:end], temperature, caps[start:end], eos_ids, generator)
    return out


def _sample_chunk(
    model: torch.nn.Module,
    prompts: list[list[int]],
    temperature: float,
    caps: list[int],
    eos_ids: frozenset[int],
    generator: torch.Generator,
) -> list[Sampled]:
    was_training = model.training
    model.eval()
    fwd = BatchedForward(model)
    B = len(prompts)
    batch, logits_B_V = fwd.prefill(prompts)
    temperature_B = torch.full((B,), float(temperature))
    top_p_B, top_k_B = torch.ones(B), torch.full((B,), -1, dtype=torch.long)
    greedy_B = temperature_B <= 0
    ids: list[list[int]] = [[] for _ in range(B)]
    lps: list[list[float]] = [[] for _ in range(B)]
    finish: list[FinishReason | None] = [None] * B
    positions = [len(p) for p in prompts]
    eos = torch.tensor(sorted(eos_ids))
    for _ in range(max(caps)):
        logprobs_B_V = processed_logprobs(logits_B_V, temperature_B, top_p_B, top_k_B)
        tok_B = sample(logprobs_B_V, greedy_B, [None] * B, generator)
        lp_B = logprobs_B_V.gather(1, tok_B[:, None]).squeeze(1)
        if temperature <= 0:  # greedy rows report log-softmax at T = 1 (see sampling.py)
            lp_B = logits_B_V.float().log_softmax(-1).gather(1, tok_B[:, None]).squeeze(1)
        is_eos_B = torch.isin(tok_B, eos)
        for r in range(B):
            if finish[r] is None:
                ids[r].append(int(tok_B[r]))
                lps[r].append(float(lp_B[r]))
                if bool(is_eos_B[r]):
                    finish[r] = FinishReason.STOP
                elif len(ids[r]) >= caps[r]:
                    finish[r] = FinishReason.LENGTH
        if all(f is not None for f in finish):
            break
        logits_B_V = fwd.decode(batch, tok_B.tolist(), positions)
        positions = [p + 1 for p in positions]
    model.train(was_training)
    return [Sampled(ids[r], lps[r], finish[r] or FinishReason.LENGTH) for r in range(B)]
