"""Packed rows through linear-attention (Gated-DeltaNet) layers: segments kept apart, exactly.

The trainer packs several segments into one row (position ids restart, `cu_seq_lens_q` marks
the boundaries; varlen.py keeps them apart in attention layers). A Gated-DeltaNet layer —
Qwen3.5's and Qwen3-Next's linear attention — would instead carry its causal-convolution
window and its recurrent state from the end of one segment into the next: transformers'
pure-torch kernels ignore `cu_seqlens` (only flash-linear-attention's varlen kernels take it,
and even then the short convolution runs over the whole row). Every segment after the first
would then be computed in a context the rollout never had.

`segment_aware(model)` gives every such layer an instance `forward` (shadowing the class's;
nothing in site-packages is edited) that, when varlen arguments are present and there is no
cache, runs the layer's own forward on each segment's slice and concatenates: exactly the
computation of unpacked per-segment forwards, on any device, with autograd through it.
Without varlen arguments (generation with a cache, an unpacked forward) the original forward
runs unchanged. The cost is one layer call per segment instead of one per row; a fused path
through flash-linear-attention's `chunk_gated_delta_rule(cu_seqlens=...)` plus a per-segment
convolution would remove it on GPUs and is not written yet (nothing here can run it).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

LINEAR_ATTENTION_SUFFIXES = ("GatedDeltaNet",)
_VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def linear_attention_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith(LINEAR_ATTENTION_SUFFIXES)]


def _segmented_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    cu = kwargs.get("cu_seq_lens_q")
    cache = kwargs.get("cache", kwargs.get("cache_params", args[0] if args else None))
    forward = type(self).forward
    if cu is None or cache is not None:
        return forward(self, hidden_states, *args, **kwargs)
    if hidden_states.shape[0] != 1:
        raise ValueError("a packed linear-attention forward expects one packed row (batch size 1)")
    rest = {k: v for k, v in kwargs.items() if k not in _VARLEN_KEYS and k != "attention_mask"}
    bounds = cu.tolist()
    if len(bounds) == 2:
        return forward(self, hidden_states, *args, attention_mask=None, **rest)
    outs = [
        forward(self, hidden_states[:, s:e], *args, attention_mask=None, **rest)
        for s, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(outs, dim=1)


def segment_aware(model: nn.Module) -> int:
    """Make the model's linear-attention layers keep packed segments apart (idempotent);
    returns how many layers there are."""
    layers = linear_attention_layers(model)
    for layer in layers:
        if "forward" not in vars(layer):
            layer.forward = types.MethodType(_segmented_forward, layer)
    return len(layers)
