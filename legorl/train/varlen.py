"""`legorl_varlen`: packed-sequence attention that costs what the segments cost, on any device.

transformers runs packed rows (position ids restarting per segment) correctly with `sdpa`
(where the model's forward hands its mask builders the position ids: gpt-oss's does not, and
`packed_masks` below builds its masks instead), but by materialising a block-diagonal
(N × N) mask: attention then costs N² for N packed tokens instead of Σ n_i², and the mask
disables SDPA's flash kernel. Measured on this
project's CPU bench, packing with `sdpa` made a step ~2× slower than unpacked batches.

This attention function is registered under the name `legorl_varlen`. Given the standard
varlen keyword arguments (`cu_seq_lens_q`/`cu_seq_lens_k`, which `flash_attention_2` also
takes), it runs transformers' own `sdpa_attention_forward` causally on each segment's slice
of q/k/v — exactly the computation of an unpadded single-sequence forward, GQA handling
included — and concatenates. Without them (KV-cache decoding in the reference sampler) it is
plain causal `sdpa`. No attention-mask function is registered for it, so transformers builds
no mask: it is meant for the trainer's model, whose inputs are packed or unpadded, never for
left-padded batches (the engines keep their own model on `sdpa`).

Attention that SDPA cannot express — gpt-oss's sinks (`s_aux`, an extra per-head logit in the
softmax) and its sliding-window layers — runs through the model family's own
`eager_attention_forward` instead, per segment, with a causal (and windowed) mask built here:
again exactly the computation of an unpadded single-sequence forward.
"""

from __future__ import annotations

import sys
from itertools import pairwise

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from legorl.train import branch_attention

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
    if kwargs.get("s_aux") is not None or kwargs.get("sliding_window") is not None:
        return _eager_attention(module, query, key, value, cu, dropout, scaling, **kwargs)
    if cu is None and attention_mask is None and 1 < query.shape[2] < key.shape[2]:
        # queries after a cached prefix (a shared-prefix branch): SDPA's `is_causal` aligns its
        # triangle top-left, so the bottom-right causal mask is given explicitly, or on CPU the
        # prefix and the branch's own keys go as two unmasked kernels (branch_attention.py)
        if branch_attention.usable(query, dropout, kwargs):
            return branch_attention.branch_attention(query, key, value, scaling), None
        mask = causal_mask(query.shape[2], key.shape[2], None, query.dtype, query.device)
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(
            module, query, key, value, mask, dropout=dropout, scaling=scaling, is_causal=False, **kwargs
        )
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
            module,
            query[:, :, s:e],
            key[:, :, s:e],
            value[:, :, s:e],
            None,
            dropout=dropout,
            scaling=scaling,
            **kwargs,
        )[0]
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(outs, dim=1), None  # (1, N, heads, head_dim)


def causal_mask(q_len: int, k_len: int, window: int | None, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(1, 1, q_len, k_len) additive mask: the queries are the last q_len of k_len positions;
    each sees keys at or before it (and, with `window`, fewer than `window` positions back)."""
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    k_pos = torch.arange(k_len, device=device)[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= q_pos - k_pos < window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def _eager_attention(module, query, key, value, cu, dropout, scaling, **kwargs):  # type: ignore[no-untyped-def]
    """The model's own eager attention (sinks, sliding window), per segment when packed."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise ValueError(
            f"legorl_varlen: {type(module).__name__} needs its eager attention (sinks or a window), "
            "but its module defines no eager_attention_forward; use attn_implementation = 'eager'"
        )
    window = kwargs.pop("sliding_window", None)
    kwargs.pop("is_causal", None)
    bounds = cu.tolist() if cu is not None and query.shape[2] == key.shape[2] else [0, key.shape[2]]
    if cu is not None and query.shape[0] != 1:
        raise ValueError("legorl_varlen attention expects one packed row (batch size 1)")
    outs = []
    for s, e in pairwise(bounds):
        q = query[:, :, s:e] if len(bounds) > 2 else query
        k, v = key[:, :, s:e], value[:, :, s:e]
        outs.append(windowed(eager, module, q, k, v, window, dropout, scaling, kwargs))
    return (torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]), None


def windowed(eager, module, q, k, v, window: int | None, dropout: float, scaling, kwargs, block: int = 0):  # type: ignore[no-untyped-def]
    """One segment's eager attention; the queries are the last `q` of `k`'s positions.

    Under a window, a query sees at most `window` keys, so the queries go in blocks, each
    with only the keys its window can reach: the cost is linear in the segment, not
    quadratic (a 6.4k-token harness prompt under a 64-token window: ~25x less). A masked
    key's weight is exactly 0 either way, so the blocks compute what one full mask does."""
    q_len, k_len = q.shape[2], k.shape[2]
    block = block or max(window or 0, 128)
    if window is None or q_len <= block:
        mask = causal_mask(q_len, k_len, window, q.dtype, q.device)
        return eager(module, q, k, v, mask, dropout=dropout, scaling=scaling, **kwargs)[0]
    offset, outs = k_len - q_len, []
    for qs in range(0, q_len, block):
        qe = min(q_len, qs + block)
        ks, ke = max(0, offset + qs - window + 1), offset + qe
        mask = causal_mask(qe - qs, ke - ks, window, q.dtype, q.device)
        outs.append(
            eager(
                module, q[:, :, qs:qe], k[:, :, ks:ke], v[:, :, ks:ke], mask, dropout=dropout, scaling=scaling, **kwargs
            )[0]
        )
    return torch.cat(outs, dim=1)


def packed_masks(config, embeds_B_S_H: torch.Tensor, position_ids_B_S: torch.Tensor) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The prepared {layer type: mask} mapping of a packed row under a mask-based kernel.

    transformers derives a block-diagonal mask from position-id resets only when the model's
    forward passes `position_ids` to its mask builders; gpt-oss's does not, so its packed rows
    got one causal (and windowed) mask across all segments. Calling the same builders with
    the position ids gives exactly the masks a forward that passed them would have built; the
    model takes a prepared mapping as its `attention_mask` (packed_families.py says which)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    builders = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if unknown := types - builders.keys():
        raise ValueError(f"packed_masks: no mask builder for layer types {sorted(unknown)}")
    return {t: builders[t](config, embeds_B_S_H, None, None, position_ids=position_ids_B_S) for t in types}


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
