"""Shared-prefix (tree) forward: tokens that several packed segments share are computed once.

A native harness opens every conversation with the same long prompt (its system prompt and
tool list, ~5-8k tokens), and a GSPO group's rollouts share their whole first prompt; packed
as separate segments, that prompt is computed once per segment, forward and backward, and
attention over it is quadratic. Here a micro-batch's segments are grouped by their first
tokens; each group's longest common prefix runs through the decoder once, keeping its KV
cache, and every member's remainder (a "branch") runs on top of that cache with positions
continuing from the prefix. The packed hidden states are then gathered back into the
micro-batch's own layout, so the LM head, the loss and everything after are unchanged, and
autograd sums each branch's gradient into the prefix: the step equals the unshared step
(tests/train/test_train_shared_prefix.py checks logprobs and every gradient against `packed`).

Inside a group the same is done again (a tree): what members share beyond the group's prefix
(a GSPO group's task statement after the harness's system prompt) is computed once more.

Verified exact: dense attention (Qwen3, Qwen2, Llama); MoE with routing replay (a span is
shared only where every member's recorded experts agree, so the one forward replays one
routing); sliding windows and sinks, gpt-oss's and a windowed Qwen3's (the branch's cache
masks them, under the trainer's varlen or eager attention); Qwen3.5's hybrid, dense and MoE,
whose Gated-DeltaNet layers carry the prefix's recurrent and convolution states into each
branch (carried_state.py: the same tensors, so each branch's gradient flows back through
them). Any unverified family falls back to `packed` with one line naming why
(`sharing_refusal`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from legorl.train.carried_state import LINEAR_LAYER_TYPE, has_linear_layers, hybrid_cache
from legorl.train.varlen import NAME as VARLEN

RECURRENT_TYPES = ("qwen3_5_text", "qwen3_5_moe_text")  # Gated-DeltaNet + attention: states carried (tested)
SHAREABLE_TYPES = ("qwen3", "qwen2", "llama", "qwen3_moe", "gpt_oss", "glm4_moe", *RECURRENT_TYPES)  # exact, tested
WINDOWED_TYPES = ("gpt_oss", "qwen3")  # sliding window and sinks: the branch's cache masks them (tested)
MIN_SHARE = 32  # a prefix shorter than this is not worth a forward of its own


# a shared-prefix step runs one decoder call per tree level and branch, which differ between
# ranks; every FSDP forward is a collective, so sharded training packs instead
SHARDED_REFUSAL = (
    "shared-prefix packing: sharded ranks would run different numbers of forwards (FSDP gathers each); packed instead"
)


def sharing_refusal(lm: nn.Module, sharded: bool = False) -> str | None:
    """Why this model, trained on one rank or `sharded` over several, cannot share prefixes
    (None: it can). An MoE family shares with routing replay (a span is shared only where the
    members' recorded experts agree), so the family's type decides, then the sharding."""
    cfg = lm.config
    kind = getattr(cfg, "model_type", "?")
    if kind not in SHAREABLE_TYPES:
        verified = ", ".join(SHAREABLE_TYPES)
        return f"shared-prefix packing: not verified for model type {kind!r} (verified: {verified}); packed instead"
    types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kind in RECURRENT_TYPES:
        types -= {LINEAR_LAYER_TYPE}  # carried into each branch (carried_state.py)
    windowed = bool(types - {"full_attention"}) or bool(getattr(cfg, "use_sliding_window", False))
    if windowed and kind not in WINDOWED_TYPES:
        return (
            f"shared-prefix packing: {kind} has layer types {sorted(types)} (a window needs its own rule); "
            "packed instead"
        )
    attention = getattr(cfg, "_attn_implementation", None)
    if windowed and attention not in (VARLEN, "eager"):
        return (
            f"shared-prefix packing: {kind}'s window is masked over a branch's cache only by the "
            f"{VARLEN!r} or eager attention, not {attention!r}; packed instead"
        )
    return SHARDED_REFUSAL if sharded else None


CHECKPOINTING_REFUSAL = (
    "shared-prefix packing: gradient checkpointing drops a layer's cache (a branch would lose its prefix); "
    "packed instead"
)


def checkpointing_refusal(lm: nn.Module) -> str | None:
    """transformers' gradient checkpointing drops every layer's cache while training (a
    recomputed layer would write it twice), so a branch would run without its prefix."""
    name = (
        "is_activation_checkpointing"
        if hasattr(type(lm), "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    if getattr(lm, name, False) and lm.training and torch.is_grad_enabled():
        return CHECKPOINTING_REFUSAL
    return None


@dataclass(frozen=True)
class PrefixGroup:
    """Segments (indices into the micro-batch's segment list) whose first `length` tokens agree."""

    length: int
    members: tuple[int, ...]


def common_length(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.numel(), b.numel())
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if differ.numel() else n


def reach(end: int, min_share: int, align: int) -> int:
    """Where a span shared from `end` ends at the earliest: `min_share` tokens on, rounded up
    to the alignment (members are grouped by their tokens up to there)."""
    return -(-(end + min_share) // align) * align


def prefix_groups(
    ids_N: torch.Tensor,
    lengths: list[int],
    min_share: int = MIN_SHARE,
    align: int = 1,
    pos_N: torch.Tensor | None = None,
) -> list[PrefixGroup]:
    """Group segments by their first `min_share` tokens (rounded up to `align`) and, given
    `pos_N`, their first position (a segment packed without its unseen head starts above 0:
    the same tokens at another position are another computation); each group of
    two or more shares its longest common prefix, less one token, so every member keeps at
    least one token of its own (the last shared position predicts the member's first own
    token, which may differ), rounded down to a multiple of `align`."""
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    head = reach(0, min_share, align)
    by_head: dict[tuple[int, ...], list[int]] = {}
    for s, (start, n) in enumerate(zip(starts, lengths, strict=True)):
        if n > head:
            first = () if pos_N is None else (-1 - int(pos_N[start]),)  # ids are >= 0: no clash
            by_head.setdefault(first + tuple(ids_N[start : start + head].tolist()), []).append(s)
    groups = []
    for members in by_head.values():
        if len(members) < 2:
            continue
        lead = ids_N[starts[members[0]] : starts[members[0]] + lengths[members[0]]]
        p = min(common_length(lead, ids_N[starts[m] : starts[m] + lengths[m]]) for m in members[1:])
        length = (p - 1) - (p - 1) % align
        if length >= min_share:
            groups.append(PrefixGroup(length, tuple(members)))
    return groups


def branch_cache(prefix_cache: object | None, config: object) -> object | None:
    """A fresh cache holding the prefix's key/value tensors (the same tensors: a branch's
    update concatenates into new ones, so the prefix's stay shared and keep their graph) and,
    for a Gated-DeltaNet hybrid, its recurrent and convolution states (carried_state.py).
    None (no prefix, no recurrent layers): the model makes its own."""
    from transformers import DynamicCache

    if has_linear_layers(config):
        return hybrid_cache(config, prefix_cache)
    if prefix_cache is None:
        return None
    cache = DynamicCache()
    for layer in range(int(config.num_hidden_layers)):  # type: ignore[attr-defined]
        k, v = prefix_cache.layers[layer].keys, prefix_cache.layers[layer].values  # type: ignore[attr-defined]
        cache.update(k, v, layer)
    return cache


Span = tuple[torch.Tensor, object, torch.Tensor | None, torch.Tensor | None]  # hidden, cache, used, natural


class DecoderCall(Protocol):
    """One decoder forward over `ids_1_S` on top of `cache` (None: from nothing), replaying
    `replay_S_L_K` where given; returns the span's hidden (S, H), its cache, and for an MoE
    model the experts used and the router's own choice (S, L, K)."""

    def __call__(
        self, ids_1_S: torch.Tensor, pos_1_S: torch.Tensor, cache: object | None, replay_S_L_K: torch.Tensor | None
    ) -> Span: ...


class PackedCall(Protocol):
    """The unshared segments, packed as before: (hidden, used, natural) of positions `idx`."""

    def __call__(
        self, idx: torch.Tensor, lengths: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]: ...


@dataclass
class Shared:
    """The packed row's decoder output and, for MoE, its routing, in packed order."""

    hidden_N_H: torch.Tensor
    used_N_L_K: torch.Tensor | None
    natural_N_L_K: torch.Tensor | None


def shared_hidden(
    call: DecoderCall,
    packed: PackedCall,
    ids_N: torch.Tensor,
    pos_N: torch.Tensor,
    lengths: list[int],
    groups: list[PrefixGroup],
    replay_N_L_K: torch.Tensor | None = None,
    align: int = 1,
) -> Shared:
    """Decoder output of the packed row, each group's prefix computed once, and inside
    a group every further prefix its members share (a tree: a harness's system prompt for the
    whole micro-batch, then each task's first message for that task's GSPO group).

    With routing replay a span is shared only as far as its members' recorded experts agree
    too: the prefix is one forward, so it can replay one routing. With `align` > 1 every
    shared span ends at a multiple of it from its segment's start (carried_state.py: a
    Gated-DeltaNet prefix ends on a chunk boundary of the delta rule)."""
    tree = _Tree(call, ids_N, pos_N, lengths, replay_N_L_K, align)
    shared: set[int] = set()
    for g in groups:
        length = tree.aligned(tree.agreed(g.members, 0, g.length))
        if length >= MIN_SHARE:
            tree.node(g.members, 0, length, None)
            shared.update(g.members)
    rest = [m for m in range(len(lengths)) if m not in shared]
    if rest:
        idx = torch.cat([torch.arange(tree.starts[m], tree.starts[m] + lengths[m]) for m in rest])
        hidden, used, natural = packed(idx, [lengths[m] for m in rest])
        tree.keep(hidden, used, natural)
        tree.source_N[idx] = torch.arange(tree.offset, tree.offset + idx.numel())
    return tree.gathered()


class _Tree:
    """The computed rows (`pieces`) and, for every packed position, the row it copies."""

    def __init__(
        self,
        call: DecoderCall,
        ids_N: torch.Tensor,
        pos_N: torch.Tensor,
        lengths: list[int],
        replay_N_L_K: torch.Tensor | None,
        align: int = 1,
    ) -> None:
        self.call, self.ids_N, self.pos_N, self.lengths, self.replay_N_L_K = call, ids_N, pos_N, lengths, replay_N_L_K
        self.align = align
        self.starts = [0]
        for n in lengths[:-1]:
            self.starts.append(self.starts[-1] + n)
        self.pieces: list[torch.Tensor] = []
        self.used: list[torch.Tensor] = []
        self.natural: list[torch.Tensor] = []
        self.source_N = torch.empty(ids_N.numel(), dtype=torch.long)
        self.offset = 0

    def aligned(self, end: int) -> int:
        """`end` rounded down to a multiple of the alignment (a position from the segment's start)."""
        return end - end % self.align

    def agreed(self, members: Sequence[int], begin: int, end: int) -> int:
        """How far from `begin` (at most to `end`) every member's recorded routing agrees with
        the first's: the whole span without replay."""
        if self.replay_N_L_K is None:
            return end - begin
        s0 = self.starts[members[0]]
        lead_S = self.replay_N_L_K[s0 + begin : s0 + end]
        n = end - begin
        for m in members[1:]:
            s = self.starts[m]
            differ = (self.replay_N_L_K[s + begin : s + end] != lead_S).flatten(1).any(1).nonzero()
            if differ.numel():
                n = min(n, int(differ[0]))
        return n

    def keep(self, hidden: torch.Tensor, used: torch.Tensor | None, natural: torch.Tensor | None) -> None:
        self.pieces.append(hidden)
        if used is not None and natural is not None:
            self.used.append(used)
            self.natural.append(natural)

    def gathered(self) -> Shared:
        src = self.source_N.to(self.pieces[0].device)
        hidden = (torch.cat(self.pieces) if len(self.pieces) > 1 else self.pieces[0]).index_select(0, src)
        if not self.used:
            return Shared(hidden, None, None)
        return Shared(hidden, torch.cat(self.used).index_select(0, src), torch.cat(self.natural).index_select(0, src))

    def _run(self, lead: int, begin: int, end: int, cache: object | None) -> object:
        """Tokens [begin, end) of segment `lead` on top of `cache`; their rows are kept."""
        s = self.starts[lead]
        replay = None if self.replay_N_L_K is None else self.replay_N_L_K[s + begin : s + end]
        hidden, below, used, natural = self.call(
            self.ids_N[None, s + begin : s + end], self.pos_N[None, s + begin : s + end], cache, replay
        )
        self.keep(hidden, used, natural)
        return below

    def node(self, members: Sequence[int], begin: int, end: int, cache: object | None) -> None:
        """Run the span [begin, end) the `members` share once, then what each shares further."""
        at = self.offset
        below = self._run(members[0], begin, end, cache)
        self.offset += end - begin
        for m in members:
            self.source_N[self.starts[m] + begin : self.starts[m] + end] = torch.arange(at, at + end - begin)
        by_head: dict[tuple[int, ...], list[int]] = {}
        far = reach(end, MIN_SHARE, self.align)
        for m in members:
            s, n = self.starts[m], self.lengths[m]
            head = tuple(self.ids_N[s + end : s + min(n, far)].tolist())
            by_head.setdefault(head if n > far else (-1 - m,), []).append(m)
        for sub in by_head.values():
            if len(sub) > 1:
                lead = self.ids_N[self.starts[sub[0]] + end : self.starts[sub[0]] + self.lengths[sub[0]]]
                p = min(
                    common_length(lead, self.ids_N[self.starts[m] + end : self.starts[m] + self.lengths[m]])
                    for m in sub[1:]
                )
                stop = self.aligned(end + self.agreed(sub, end, end + p - 1))
                if stop - end >= MIN_SHARE:
                    self.node(sub, end, stop, below)
                    continue
            for m in sub:
                at = self.offset
                self._run(m, end, self.lengths[m], below)
                n = self.lengths[m] - end
                self.source_N[self.starts[m] + end : self.starts[m] + self.lengths[m]] = torch.arange(at, at + n)
                self.offset += n
