"""What a sampled token's log-probability means, as pure functions the trainer can reuse.

Every in-process engine samples from, and reports the log-probability under, exactly
this distribution (vLLM calls it "processed logprobs"):

    q = renormalise( top_p_nucleus( top_k( softmax(logits / T) ) ) )

1. temperature: `logits / T` (T > 0);
2. top-k (`top_k > 0`): keep the k highest logits (ties with the k-th are kept too);
3. top-p (`top_p < 1`): sort the remaining tokens by probability (descending, stable),
   keep each token whose probability mass *before* it is < top_p (so the most likely
   token is always kept), drop the rest;
4. renormalise over what is kept; dropped tokens get log q = -inf.

`logprob[i] = log q(completion_ids[i])` — the log-probability of the distribution the
token was actually drawn from, so `exp(sum(logprobs))` is the probability of the
completion under the sampler that produced it.

Greedy (`temperature == 0`): the token is `argmax(logits)` and its logprob is
`log_softmax(logits)` at T = 1 with no top-k/top-p (the sampling distribution would be a
point mass with logprob 0, which carries no information for importance ratios).

The trainer reproduces rollout logprobs with `token_logprobs(logits_T_V, ids_T, params)`
on its own forward pass; near a nucleus boundary its (slightly different) logits can put a
sampled token outside its own nucleus (-inf), so mismatch metrics should clip or count
such tokens.
"""

from __future__ import annotations

import math

import torch

from legorl.types import SamplingParams


def validate_params(params: SamplingParams) -> None:
    """Reject sampling parameters that have no meaning, naming the field."""
    if not math.isfinite(params.temperature) or params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not (0 < params.top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < -1 or params.top_k == 0:
        raise ValueError(f"top_k must be -1 (off) or >= 1, got {params.top_k}")
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
    if any(not isinstance(s, str) or not s for s in params.stop):
        raise ValueError(f"stop strings must be non-empty strings, got {params.stop!r}")


def processed_logprobs(
    logits_B_V: torch.Tensor,
    temperature_B: torch.Tensor,
    top_p_B: torch.Tensor,
    top_k_B: torch.Tensor,
) -> torch.Tensor:
    """log q over the vocabulary for each row (float32; -inf outside the kept support)."""
    logits_B_V = logits_B_V.float()
    V = logits_B_V.shape[-1]
    greedy_B = temperature_B <= 0
    temp_B = torch.where(greedy_B, torch.ones_like(temperature_B), temperature_B).float()
    scaled_B_V = logits_B_V / temp_B[:, None]

    k_B = torch.where(greedy_B | (top_k_B <= 0) | (top_k_B >= V), torch.full_like(top_k_B, V), top_k_B)
    if bool((k_B < V).any()):
        kmax = int(k_B.max())
        topv_B_K = scaled_B_V.topk(kmax, dim=-1).values
        kth_B = topv_B_K.gather(1, (k_B - 1).clamp(max=kmax - 1).long()[:, None])
        drop_B_V = (scaled_B_V < kth_B) & (k_B < V)[:, None]
        scaled_B_V = scaled_B_V.masked_fill(drop_B_V, float("-inf"))

    p_B = torch.where(greedy_B, torch.ones_like(top_p_B), top_p_B).float()
    if bool((p_B < 1).any()):
        sorted_B_V, order_B_V = scaled_B_V.sort(dim=-1, descending=True, stable=True)
        probs_B_V = sorted_B_V.softmax(-1)
        mass_before_B_V = probs_B_V.cumsum(-1) - probs_B_V
        drop_sorted_B_V = (mass_before_B_V >= p_B[:, None]) & (p_B < 1)[:, None]
        drop_sorted_B_V[:, 0] = False  # the most likely token is always in the nucleus
        drop_B_V = torch.zeros_like(drop_sorted_B_V).scatter(1, order_B_V, drop_sorted_B_V)
        scaled_B_V = scaled_B_V.masked_fill(drop_B_V, float("-inf"))
    return scaled_B_V.log_softmax(-1)


def params_tensors(
    params: list[SamplingParams], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(temperature_B, top_p_B, top_k_B) for a batch of requests."""
    temperature_B = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_p_B = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    top_k_B = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)
    return temperature_B, top_p_B, top_k_B


def sample(
    logprobs_B_V: torch.Tensor,
    greedy_B: torch.Tensor,
    generators: list[torch.Generator | None],
    default: torch.Generator | None,
) -> torch.Tensor:
    """Draw one token per row from exp(logprobs) by inverse CDF; argmax for greedy rows.

    Each row uses one uniform number. A row with its own generator (a request with a
    seed) draws it from that generator alone, so its completion does not depend on which
    other requests share the batch; the other rows share `default`.
    """
    B = logprobs_B_V.shape[0]
    u_B = torch.rand(B, generator=default, device=logprobs_B_V.device)
    for r, g in enumerate(generators):
        if g is not None:
            u_B[r] = torch.rand(1, generator=g, device=logprobs_B_V.device)[0]
    cdf_B_V = logprobs_B_V.exp().cumsum(-1)
    target_B_1 = (u_B * cdf_B_V[:, -1])[:, None]
    drawn_B = torch.searchsorted(cdf_B_V, target_B_1, right=True).squeeze(1).clamp(max=logprobs_B_V.shape[1] - 1)
    return torch.where(greedy_B, logprobs_B_V.argmax(-1), drawn_B)


def token_logprobs(logits_T_V: torch.Tensor, ids_T: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logprob of each token under the engine's sampling distribution (for the trainer).

    `logits_T_V[t]` must be the logits that predicted `ids_T[t]` (i.e. the model output at
    position t-1 of the full sequence).
    """
    T = logits_T_V.shape[0]
    dev = logits_T_V.device
    temperature_T = torch.full((T,), float(params.temperature), device=dev)
    top_p_T = torch.full((T,), float(params.top_p), device=dev)
    top_k_T = torch.full((T,), int(params.top_k), dtype=torch.long, device=dev)
    logprobs_T_V = processed_logprobs(logits_T_V, temperature_T, top_p_T, top_k_T)
    return logprobs_T_V.gather(1, ids_T.long().to(dev)[:, None]).squeeze(1)
