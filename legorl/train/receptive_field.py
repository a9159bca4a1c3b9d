"""How far back a windowed model can see: a trajectory's head beyond that is never computed.

In a model whose every layer attends through a sliding window of W keys, a position's output
after L layers depends only on the L·(W−1) tokens before it. A native harness opens each
conversation with 15–26k tokens (its system prompt and tool list); under such a model the
first sampled token's logprob depends on the last few hundred of them, and the rest cost a
forward and a backward for nothing. Shared-prefix packing already computes one copy of a
prompt per micro-batch; a mixed-harness batch holds three of them (three harnesses'
prompts), and a GSPO step one per group.

`pack(..., receptive=R)` therefore drops each segment's tokens more than R before its first
sampled target (R = L·W, a margin of L over the exact bound). What is kept keeps its recorded
positions, so the rotary angles are the ones the engine used, not merely equal up to a shift:
the logprobs and gradients are those of the whole segment, up to float summation order
(tests/train/test_train_receptive_field.py checks both against the untrimmed forward).

Only where that is exact and checked: every layer windowed, plain rotary positions, the
trainer's `legorl_varlen` attention (whose masks come from the segment lengths, not from the
position ids, which a trimmed segment no longer starts at 0), and a family checked by that
test. Anything else gets None: the whole segment, as before.
"""

from __future__ import annotations

from torch import nn

from legorl.train.varlen import NAME as VARLEN

TRIMMABLE_TYPES = ("qwen3",)  # checked against the untrimmed forward (tests/train/test_train_receptive_field.py)
WINDOWED = "sliding_attention"
SHIFTABLE_ROPE = ("default", "linear")  # scaling independent of the sequence's length


def receptive_field(lm: nn.Module) -> int | None:
    """Tokens before a position that can change its output (with a margin), or None where
    every earlier token can (a full-attention layer, or a case not verified exact)."""
    cfg = lm.config
    if getattr(cfg, "model_type", None) not in TRIMMABLE_TYPES:
        return None
    if getattr(cfg, "_attn_implementation", None) != VARLEN:
        return None
    window = getattr(cfg, "sliding_window", None)
    layers = int(getattr(cfg, "num_hidden_layers", 0))
    types = list(getattr(cfg, "layer_types", None) or [])
    if not window or not layers or len(types) != layers or any(t != WINDOWED for t in types):
        return None
    rope = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}
    if str(rope.get("rope_type", rope.get("type", "default"))) not in SHIFTABLE_ROPE:
        return None
    return layers * int(window)
