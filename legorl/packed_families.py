"""The model families whose packed recompute is verified, and the trainer's refusal of the others.

A packed row (several trajectories end to end, position ids restarting at 0) is correct only
if every layer keeps the segments apart. That depends on the family's transformers code and on
the attention kernel, not on LEGO-RL alone: transformers' gpt-oss forward, for one, builds its
attention masks without the position ids, so under `eager` a packed row got one causal mask
over all of its segments (each trajectory attended to those before it, silently; the
per-segment forward was right). So packing is allowed only where it has been checked.

`VERIFIED` is that check's one source: tests/train/test_train_packing.py parametrises over it, and
for each entry builds the family's tiny model (model_families.py), packs trajectories of
several lengths (shorter and longer than a sliding window) and asserts that the packed forward
equals the per-segment one under each listed attention implementation. A family or kernel
added here without passing that test fails the suite; one missing here is refused by the
trainer with one line, and `packing = "per_segment"` (always correct, slower) still runs it.

Keys are `lm.config.model_type` of the loaded causal LM (Qwen3.5 checkpoints load as
`qwen3_5_moe_text` / `qwen3_5_text`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

_ALL = ("legorl_varlen", "sdpa", "eager")


@dataclass(frozen=True)
class Verified:
    family: str
    """The tiny model of model_families.py that the test checks this entry on."""
    attention: tuple[str, ...] = _ALL
    """Attention implementations under which packed == per-segment is tested."""
    own_masks: bool = False
    """The model's forward builds its attention masks without the position ids (so it cannot
    see the segment boundaries): PolicyModel builds the per-layer-type masks of a packed row
    itself (varlen.packed_masks) when the kernel is mask-based (eager, sdpa)."""


VERIFIED: dict[str, Verified] = {
    "qwen3": Verified("qwen3"),
    "llama": Verified("llama"),
    "qwen3_moe": Verified("qwen3_moe"),
    "qwen2_moe": Verified("qwen2_moe"),
    "qwen3_5_moe_text": Verified("qwen3_5_moe"),
    "qwen3_5_text": Verified("qwen3_5"),
    # no sdpa: transformers has none with attention sinks
    "gpt_oss": Verified("gpt_oss", ("legorl_varlen", "eager"), own_masks=True),
    "glm4_moe": Verified("glm4_moe"),
    "deepseek_v3": Verified("deepseek_v3"),
}


def attention_of(lm: nn.Module) -> str:
    return str(getattr(lm.config, "_attn_implementation", None))


def packing_refusal(lm: nn.Module) -> str | None:
    """Why packed recompute of `lm` is refused (one line), or None when it is verified."""
    model_type, attention = lm.config.model_type, attention_of(lm)
    entry = VERIFIED.get(model_type)
    if entry is None:
        return (
            f"packing = 'packed' is not verified for model type {model_type!r} "
            f"(verified: {', '.join(VERIFIED)}); set packing = 'per_segment'"
        )
    if attention not in entry.attention:
        return (
            f"packing = 'packed' is not verified for {model_type!r} with attn_implementation = {attention!r} "
            f"(verified: {', '.join(entry.attention)}); choose one of those or set packing = 'per_segment'"
        )
    return None


def own_masks(lm: nn.Module) -> bool:
    """Whether PolicyModel must hand this model the masks of a packed row (see `Verified.own_masks`)."""
    entry = VERIFIED.get(lm.config.model_type)
    return entry is not None and entry.own_masks and attention_of(lm) in ("eager", "sdpa")
