"""`legorl_varlen`: packed-sequence attention that costs what the segments cost, on any device.

transformers runs packed rows (position ids restarting per segment) correctly with `sdpa`,
but by materialising a block-diagonal (N × N) mask: attention then costs N² for N packed
tokens instead of Σ n_i², and the mask disables SDPA's flash kernel. Measured on this
project's CPU bench, packing with `sdpa` made a step ~2× slower than unpacked batches.

This attention function is registered under the name `legorl_varlen`. Given the standard
varlen keyword arguments (`cu_seq_lens_q`/`cu_seq_lens_k`, which `flash_attention_2` also
takes), it runs transformers' own `sdpa_attention_forward` causally on each segment's slice
of q/k/v — exactly the computation of an unpadded single-sequence forward, GQA handling
included — and concatenates. Without them (KV-cache decoding in the reference sampler) it is
plain causal `sdpa`. No attention-mask function is registered for it, so transformers builds
no mask: it is meant for the trainer's model, whose inputs are packed or unpadded, never for
left-padded batches (the engines keep their own model on `sdpa`).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "legorl_varlen"


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    cu = kwargs.pop("cu_seq_lens_q", None)
    for k in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(k, None)
    if cu is None or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError("legorl_varlen attention expects one packed row (batch size 1)")
    bounds = cu.tolist()
    if len(bounds) == 2:
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    outs = [
        sdpa_attention_forward(
            module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
            dropout=dropout, scaling=scaling, **kwargs,
        )[0]
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]  # fmt: skip
    return torch.cat(outs, dim=1), None  # (1, N, heads, head_dim)


def register() -> str:
    """Make `attn_implementation="legorl_varlen"` available to transformers (idempotent)."""
    AttentionInterface.register(NAME, varlen_attention)
    return NAME


def varlen_kwargs(segment_lengths: list[int], device: torch.device) -> dict[str, torch.Tensor | int]:
    """The flash-attention-style varlen arguments for a packed row of these segments."""
    cu = torch.zeros(len(segment_lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(segment_lengths, dtype=torch.int32), 0)
    cu = cu.to(device)
    longest = max(segment_lengths)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
