"""A shared prefix's Gated-DeltaNet state, carried into each of its branches.

A linear-attention (Gated-DeltaNet) layer — Qwen3.5's and Qwen3-Next's — has no per-token
key/value cache: what a branch needs from the prefix it continues is the layer's recurrent
state at the prefix's end (B, H, K, V) and its short causal convolution's window, the last
`kernel` pre-convolution inputs (B, C, kernel). transformers keeps both in a cache layer, and
the layer's own forward (`cache` given) starts its convolution from the window and its gated
delta rule from the state (`initial_state`), so the branch computes exactly what the whole
sequence would.

transformers' cache layer writes those states in place (`copy_` into fixed buffers, kept for
CUDA graphs), and its one-token step updates the window in place too. Under shared-prefix
packing one prefix's states start several branches and stay in autograd's graph, so an
in-place write would change what a sibling branch starts from and what backward reads.
`CarriedStateLayer` replaces its tensors instead of writing into them: the prefix's states
are the very tensors every branch starts from, and autograd sums each branch's gradient back
through them into the prefix (shared_prefix.py; tests/train/test_train_shared_prefix.py checks the
step against `packed`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache, LinearAttentionCacheLayerMixin, LinearAttentionLayer

LINEAR_LAYER_TYPE = "linear_attention"
DELTA_RULE_CHUNK = 64  # the chunk of the gated delta rule: transformers' torch kernel's and flash-linear-attention's


class CarriedStateLayer(LinearAttentionLayer):
    """A linear-attention cache layer that starts from given states (None: from nothing) and
    replaces them on update, never writing into a tensor a sibling branch or backward reads."""

    def __init__(self, conv_B_C_K: torch.Tensor | None = None, state_B_H_K_V: torch.Tensor | None = None) -> None:
        super().__init__(number_of_states=1)
        # "recording the past" makes the layer's forward take its general path on a one-token
        # branch too (the fused one-token update writes the window in place)
        self.record_past = True
        if conv_B_C_K is not None and state_B_H_K_V is not None:
            self.conv_states[0], self.recurrent_states[0] = conv_B_C_K, state_B_H_K_V
            self.conv_kernel_size[0] = conv_B_C_K.shape[-1]
            self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = True
            self.has_previous_state[0] = True
            self.dtype, self.device = conv_B_C_K.dtype, conv_B_C_K.device

    def update_conv_state(
        self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size: int | None = None, **kwargs: Any
    ) -> torch.Tensor:
        """The window the convolution sees (the carried one, then `conv_states`); keeps its last
        `kernel` columns, zero-padded on the left as the convolution's own padding would be."""
        kernel = conv_kernel_size or self.conv_kernel_size[state_idx] or conv_states.shape[-1]
        before = self.conv_states[state_idx] if self.has_previous_state[state_idx] else None
        full_B_C_T = conv_states if before is None else torch.cat([before, conv_states], dim=-1)
        self.conv_states[state_idx] = F.pad(full_B_C_T, (max(0, kernel - full_B_C_T.shape[-1]), 0))[..., -kernel:]
        self.conv_kernel_size[state_idx] = kernel
        self.is_conv_states_initialized[state_idx] = self.has_previous_state[state_idx] = True
        self.dtype, self.device = conv_states.dtype, conv_states.device
        return full_B_C_T

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
        self.recurrent_states[state_idx] = recurrent_states
        self.is_recurrent_states_initialized[state_idx] = True
        return recurrent_states

    def crop(self, tokens_to_remove: int) -> None:
        """A recurrent state sums every token it has seen: it cannot be cut back to fewer
        (transformers calls `crop` only for speculative decoding, which the trainer never runs)."""
        raise RuntimeError(f"a carried Gated-DeltaNet state cannot drop its last {tokens_to_remove} tokens")


def has_linear_layers(config: Any) -> bool:
    return LINEAR_LAYER_TYPE in (getattr(config, "layer_types", None) or ())


def share_alignment(config: Any) -> int:
    """What a shared prefix's length must be a multiple of. The gated delta rule is computed in
    chunks from a sequence's start; a prefix ending on a chunk boundary leaves the branch the
    whole sequence's own chunks, so it sums the same terms in the same order. Ending anywhere
    else regroups them: the same function, yet in float32 the decay gradient (`A_log`, a sum
    whose terms nearly cancel) moved by ~1e-4 of its size."""
    return DELTA_RULE_CHUNK if has_linear_layers(config) else 1


def hybrid_cache(config: Any, prefix_cache: object | None) -> DynamicCache:
    """A cache for a model mixing Gated-DeltaNet and attention layers: every linear-attention
    layer starts from the prefix's recurrent and convolution states (the same tensors), every
    attention layer from its key/value tensors; `prefix_cache` None: an empty one."""
    cache = DynamicCache(config=config)
    for i, layer in enumerate(cache.layers):
        before = None if prefix_cache is None else prefix_cache.layers[i]  # type: ignore[attr-defined]
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            if before is None:
                cache.layers[i] = CarriedStateLayer()
            else:
                cache.layers[i] = CarriedStateLayer(before.conv_states[0], before.recurrent_states[0])
        elif before is not None and before.keys is not None:
            layer.update(before.keys, before.values)
    return cache
