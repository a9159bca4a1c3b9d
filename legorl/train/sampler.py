"""A small reference sampler: manual KV-cache decoding that records what the trainer needs.

It is the trainer's independent check of the engines (and the sampler of the minimal loop,
the optimisation test and the mismatch bench): prefill once, then one token per step from
softmax(logits / T), recording each sampled token's log-probability under exactly that
distribution and, for MoE models, the experts every fed token was routed to. It shares the
LM-head code path and precision switches with the trainer (logprobs.py) so that precision
choices can be applied to both sides and measured, not assumed.

All rows of one call share one prompt length (a group of samples of one prompt, or prompts
of equal length); a row that emits `eos_id` stops there, the others continue.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from legorl.engine.kv_batch import cache_kwarg
from legorl.train.logprobs import lm_head_logits
from legorl.train.routing import moe_routers, moe_routing
from legorl.types import Routing, as_routing


@dataclass
class Sample:
    completion_ids: list[int]
    logprobs: list[float]
    routed_experts: Routing | None  # (prompt + completion - 1, L, K)


def sample(
    lm: nn.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    eos_id: int | None = None,
    lm_head_fp32: bool = True,
    router_fp32: bool = False,
    generator: torch.Generator | None = None,
) -> list[Sample]:
    """Sample one completion per prompt row; rows must have equal prompt lengths.

    Runs the model in eval mode (restored after): a training model may have gradient
    checkpointing on, whose layers drop the KV cache in training mode (transformers <
    5.2x), and every decoding step would then run without its prefix."""
    was_training = lm.training
    lm.eval()
    try:
        return _sample(lm, prompts, max_new_tokens, temperature, eos_id, lm_head_fp32, router_fp32, generator)
    finally:
        lm.train(was_training)


@torch.no_grad()
def _sample(
    lm: nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    eos_id: int | None,
    lm_head_fp32: bool,
    router_fp32: bool,
    generator: torch.Generator | None,
) -> list[Sample]:
    if not prompts or len({len(p) for p in prompts}) != 1 or not prompts[0]:
        raise ValueError("prompts must be a non-empty list of non-empty rows of equal length")
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    device = next(lm.parameters()).device
    ids_B_P = torch.tensor(prompts, dtype=torch.long, device=device)
    b, p = ids_B_P.shape
    decoder, weight_V_H = lm.get_decoder(), lm.get_output_embeddings().weight
    if lm_head_fp32:  # cast once, not per decoding step
        weight_V_H = weight_V_H.to(torch.promote_types(weight_V_H.dtype, torch.float32))
    cache = DynamicCache(config=lm.config)
    # transformers renamed forward(past_key_values=) to cache= (5.2x); an unknown keyword is
    # swallowed by **kwargs, and every step would then run without its prefix.
    cache_kw = {cache_kwarg(decoder): cache}
    is_moe = bool(moe_routers(lm))
    out_ids = torch.zeros(b, max_new_tokens, dtype=torch.long, device=device)
    out_lp = torch.zeros(b, max_new_tokens, dtype=torch.float32, device=device)
    lengths = torch.full((b,), max_new_tokens, dtype=torch.long, device=device)
    done_B = torch.zeros(b, dtype=torch.bool, device=device)

    def step(x_B_S: torch.Tensor, start: int) -> torch.Tensor:
        pos = torch.arange(start, start + x_B_S.shape[1], device=device)[None].expand(b, -1)
        h = decoder(input_ids=x_B_S, position_ids=pos, use_cache=True, **cache_kw).last_hidden_state
        return h[:, -1]

    with moe_routing(lm, router_fp32=router_fp32) if is_moe else nullcontext() as record:
        h_B_H = step(ids_B_P, 0)
        for t in range(max_new_tokens):
            logp_B_V = torch.log_softmax(lm_head_logits(h_B_H, weight_V_H, temperature, lm_head_fp32), dim=-1)
            tok_B = torch.multinomial(logp_B_V.exp(), 1, generator=generator).squeeze(1)
            out_ids[:, t] = tok_B
            out_lp[:, t] = logp_B_V.gather(1, tok_B[:, None]).squeeze(1)
            if eos_id is not None:
                newly = (tok_B == eos_id) & ~done_B
                lengths[newly] = t + 1
                done_B |= newly
                if bool(done_B.all()):
                    break
            if t + 1 < max_new_tokens:
                h_B_H = step(tok_B[:, None], p + t)
    routing = None
    if is_moe:
        # per layer: prefill call (B*P, K) then one (B, K) call per fed sampled token
        per_layer = [
            torch.cat([calls[0].view(b, p, -1)] + [c.view(b, 1, -1) for c in calls[1:]], dim=1) for calls in record.used
        ]
        routing = torch.stack(per_layer, dim=2).cpu()  # (B, P + fed, L, K)
    samples = []
    for r in range(b):
        n = int(lengths[r])
        rows = as_routing(routing[r, : p + n - 1].numpy()) if routing is not None else None
        samples.append(Sample(out_ids[r, :n].tolist(), out_lp[r, :n].tolist(), rows))
    return samples
