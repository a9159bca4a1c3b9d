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
cache, keeps the segments apart. Two paths, the same numbers:

- on CPU (and for layer classes the fused path does not know): the layer's own forward on each
  segment's slice, concatenated — exactly unpacked per-segment forwards, nothing re-stated;
- on CUDA, for Qwen3.5's layer (`in_proj_qkv/z/b/a`): one pass over the row, the short causal
  convolution run per segment (cheap, depthwise), then the gated delta rule once over the whole
  row through the kernel transformers dispatches to, with `cu_seqlens` — flash-linear-
  attention's varlen kernel where installed. Without it transformers' torch fallback refuses
  `cu_seqlens`, and the rule is run per segment instead. The first packed call of each layer
  class on a device is checked against the per-segment forward; a disagreement (a kernel
  that ignored `cu_seqlens`) is reported once and that class falls back to per segment.

Without varlen arguments (generation with a cache, an unpacked forward) the original forward
runs unchanged. The fused path is tested on CPU against per-segment forwards
(`fused_packed_forward`, tests/train/test_train_families.py); with flash-linear-attention on a GPU it
has not been run here (no GPU, no fla on these machines).
"""

from __future__ import annotations

import logging
import sys
import types
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

LINEAR_ATTENTION_SUFFIXES = ("GatedDeltaNet",)
_VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_FUSABLE_ATTRS = (
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_b",
    "in_proj_a",
    "conv1d",
    "A_log",
    "dt_bias",
    "norm",
    "out_proj",
)
_fused_ok: dict[tuple[str, str], bool] = {}  # (layer class, device type) -> fused path verified


def linear_attention_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith(LINEAR_ATTENTION_SUFFIXES)]


def _segmented_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    cu = kwargs.get("cu_seq_lens_q")
    cache = kwargs.get("cache", kwargs.get("cache_params", args[0] if args else None))
    if cu is None or cache is not None:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    if hidden_states.shape[0] != 1:
        raise ValueError("a packed linear-attention forward expects one packed row (batch size 1)")
    rest = {k: v for k, v in kwargs.items() if k not in _VARLEN_KEYS and k != "attention_mask"}
    bounds = [int(b) for b in cu.tolist()]
    key = (type(self).__name__, hidden_states.device.type)
    if len(bounds) > 2 and fused_wanted(hidden_states) and fusable(self) and _fused_ok.get(key, True):
        out = fused_packed_forward(self, hidden_states, bounds)
        if key not in _fused_ok:  # first packed call of this class on this device: check it once
            with torch.no_grad():
                want = per_segment_forward(self, hidden_states, bounds, *args, **rest)
            err = float((out.detach() - want).abs().max() / want.abs().max().clamp(min=1e-12))
            _fused_ok[key] = err < 2e-2
            if not _fused_ok[key]:
                log.warning(
                    "fused packed %s differs from per-segment forwards (max rel. err %.3g): using per-segment forwards",
                    key[0],
                    err,
                )
                return per_segment_forward(self, hidden_states, bounds, *args, **rest)
        return out
    return per_segment_forward(self, hidden_states, bounds, *args, **rest)


def fused_wanted(hidden_states: torch.Tensor) -> bool:
    """The fused path is for GPUs (one varlen kernel instead of a call per segment); on CPU
    the per-segment forwards cost the same and re-state nothing."""
    return hidden_states.is_cuda


def per_segment_forward(
    layer: nn.Module, hidden_states: torch.Tensor, bounds: list[int], *args: Any, **kwargs: Any
) -> torch.Tensor:
    """The layer's own forward on each segment's slice of the packed row, concatenated."""
    forward = type(layer).forward
    if len(bounds) == 2:
        return forward(layer, hidden_states, *args, attention_mask=None, **kwargs)
    outs = [forward(layer, hidden_states[:, s:e], *args, attention_mask=None, **kwargs) for s, e in pairwise(bounds)]
    return torch.cat(outs, dim=1)


def fusable(layer: nn.Module) -> bool:
    """Whether the fused path knows this layer's projections (Qwen3.5's Gated-DeltaNet)."""
    ns = sys.modules[type(layer).__module__]
    has_kernels = all(hasattr(ns, f) for f in ("causal_conv1d_fn", "torch_chunk_gated_delta_rule"))
    return has_kernels and all(hasattr(layer, a) for a in _FUSABLE_ATTRS)


def fused_packed_forward(layer: nn.Module, h_1_N_H: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """Qwen3.5's GatedDeltaNet forward over a packed row (modeling_qwen3_5*.GatedDeltaNet.forward
    without cache or padding): per-segment convolution, one varlen gated-delta-rule call."""
    ns = sys.modules[type(layer).__module__]
    n = h_1_N_H.shape[1]
    segments = list(pairwise(bounds))
    qkv_1_C_N = layer.in_proj_qkv(h_1_N_H).transpose(1, 2)
    z = layer.in_proj_z(h_1_N_H).reshape(1, n, -1, layer.head_v_dim)
    b, a = layer.in_proj_b(h_1_N_H), layer.in_proj_a(h_1_N_H)
    weight = layer.conv1d.weight.squeeze(1)
    conv_1_C_N = torch.cat(
        [
            ns.causal_conv1d_fn(
                qkv_1_C_N[:, :, s:e].contiguous(), weight, layer.conv1d.bias, activation=layer.activation
            )
            for s, e in segments
        ],
        dim=2,
    )
    query, key, value = torch.split(conv_1_C_N.transpose(1, 2), [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    query = query.reshape(1, n, -1, layer.head_k_dim)
    key = key.reshape(1, n, -1, layer.head_k_dim)
    value = value.reshape(1, n, -1, layer.head_v_dim)
    beta = b.sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)
    rule = ns.torch_chunk_gated_delta_rule
    try:
        cu = torch.tensor(bounds, dtype=torch.long, device=h_1_N_H.device)
        out, _ = rule(
            query,
            key,
            value,
            g=g,
            beta=beta,
            initial_state=None,
            output_final_state=False,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu,
        )
    except ValueError as exc:  # the torch fallback refuses cu_seqlens: run the rule per segment
        if "packed sequences" not in str(exc):
            raise
        out = torch.cat(
            [
                rule(
                    query[:, s:e],
                    key[:, s:e],
                    value[:, s:e],
                    g=g[:, s:e],
                    beta=beta[:, s:e],
                    initial_state=None,
                    output_final_state=False,
                    use_qk_l2norm_in_kernel=True,
                )[0]
                for s, e in segments
            ],
            dim=1,
        )
    out = layer.norm(out.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim)).reshape(1, n, -1)
    return layer.out_proj(out)


def segment_aware(model: nn.Module) -> int:
    """Make the model's linear-attention layers keep packed segments apart (idempotent);
    returns how many layers there are."""
    layers = linear_attention_layers(model)
    for layer in layers:
        if "forward" not in vars(layer):
            layer.forward = types.MethodType(_segmented_forward, layer)
    return len(layers)
