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
(tests/test_train_shared_prefix.py checks logprobs and every gradient against `packed`).

Only families whose every layer is full causal attention can share this way: a sliding
window, attention sinks, a recurrent (Gated-DeltaNet) state or MoE routing replay each need
their own branch rule. Those fall back to `packed` with one line naming why
(`sharing_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

SHAREABLE_TYPES = ("qwen3", "qwen2", "llama")  # dense, full causal attention in every layer
MIN_SHARE = 32  # a prefix shorter than this is not worth a forward of its own


def sharing_refusal(lm: nn.Module, is_moe: bool) -> str | None:
    """Why this model cannot share prefixes (None: it can)."""
    cfg = lm.config
    kind = getattr(cfg, "model_type", "?")
    if is_moe:
        return f"shared-prefix packing: {kind} is MoE (routing replay per branch is not implemented); packed instead"
    if kind not in SHAREABLE_TYPES:
        verified = ", ".join(SHAREABLE_TYPES)
        return f"shared-prefix packing: not verified for model type {kind!r} (verified: {verified}); packed instead"
    types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"} or getattr(cfg, "use_sliding_window", False):
        return (
            f"shared-prefix packing: {kind} has layer types {sorted(types)} (a window needs its own rule); "
            "packed instead"
        )
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


def prefix_groups(ids_N: torch.Tensor, lengths: list[int], min_share: int = MIN_SHARE) -> list[PrefixGroup]:
    """Group segments by their first `min_share` tokens; each group of two or more shares its
    longest common prefix, less one token, so every member keeps at least one token of its own
    (the last shared position predicts the member's first own token, which may differ)."""
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    by_head: dict[tuple[int, ...], list[int]] = {}
    for s, (start, n) in enumerate(zip(starts, lengths, strict=True)):
        if n > min_share:
            by_head.setdefault(tuple(ids_N[start : start + min_share].tolist()), []).append(s)
    groups = []
    for members in by_head.values():
        if len(members) < 2:
            continue
        lead = ids_N[starts[members[0]] : starts[members[0]] + lengths[members[0]]]
        p = min(common_length(lead, ids_N[starts[m] : starts[m] + lengths[m]]) for m in members[1:])
        if p - 1 >= min_share:
            groups.append(PrefixGroup(p - 1, tuple(members)))
    return groups


def _cache_of(prefix_cache: object, layers: int) -> object:
    """A fresh cache holding the prefix's key/value tensors (the same tensors: a branch's
    update concatenates into new ones, so the prefix's stay shared and keep their graph)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer in range(layers):
        k, v = prefix_cache.layers[layer].keys, prefix_cache.layers[layer].values  # type: ignore[attr-defined]
        cache.update(k, v, layer)
    return cache


def shared_hidden(
    decoder: nn.Module,
    packed: callable,  # type: ignore[valid-type]  # (ids_1_S, pos_1_S, lengths) -> hidden_1_S_H
    ids_N: torch.Tensor,
    pos_N: torch.Tensor,
    lengths: list[int],
    groups: list[PrefixGroup],
) -> torch.Tensor:
    """Decoder output (N, H) of the packed row, each group's prefix computed once, and inside
    a group every further prefix its members share (a tree: a harness's system prompt for the
    whole micro-batch, then each task's first message for that task's GSPO group)."""
    tree = _Tree(decoder, ids_N, pos_N, lengths)
    shared = {m for g in groups for m in g.members}
    for g in groups:
        tree.node(g.members, 0, g.length, None)
    rest = [m for m in range(len(lengths)) if m not in shared]
    if rest:
        idx = torch.cat([torch.arange(tree.starts[m], tree.starts[m] + lengths[m]) for m in rest])
        tree.pieces.append(packed(ids_N[None, idx], pos_N[None, idx], [lengths[m] for m in rest])[0])
        tree.source_N[idx] = torch.arange(tree.offset, tree.offset + idx.numel())
    rows_R_H = torch.cat(tree.pieces) if len(tree.pieces) > 1 else tree.pieces[0]
    return rows_R_H.index_select(0, tree.source_N.to(rows_R_H.device))


class _Tree:
    """The computed rows (`pieces`) and, for every packed position, the row it copies."""

    def __init__(self, decoder: nn.Module, ids_N: torch.Tensor, pos_N: torch.Tensor, lengths: list[int]) -> None:
        self.decoder, self.ids_N, self.pos_N, self.lengths = decoder, ids_N, pos_N, lengths
        self.layers = int(decoder.config.num_hidden_layers)
        self.starts = [0]
        for n in lengths[:-1]:
            self.starts.append(self.starts[-1] + n)
        self.pieces: list[torch.Tensor] = []
        self.source_N = torch.empty(ids_N.numel(), dtype=torch.long)
        self.offset = 0

    def _run(self, lead: int, begin: int, end: int, cache: object | None) -> object:
        """Tokens [begin, end) of segment `lead` on top of `cache`; their rows are appended."""
        s = self.starts[lead]
        kwargs = {} if cache is None else {"cache": _cache_of(cache, self.layers)}
        out = self.decoder(
            input_ids=self.ids_N[None, s + begin : s + end],
            position_ids=self.pos_N[None, s + begin : s + end],
            use_cache=True,
            **kwargs,
        )
        self.pieces.append(out.last_hidden_state[0])
        return out.past_key_values

    def node(self, members: tuple[int, ...] | list[int], begin: int, end: int, cache: object | None) -> None:
        """Run the span [begin, end) the `members` share once, then what each shares further."""
        at = self.offset
        below = self._run(members[0], begin, end, cache)
        self.offset += end - begin
        for m in members:
            self.source_N[self.starts[m] + begin : self.starts[m] + end] = torch.arange(at, at + end - begin)
        by_head: dict[tuple[int, ...], list[int]] = {}
        for m in members:
            s, n = self.starts[m], self.lengths[m]
            head = tuple(self.ids_N[s + end : s + min(n, end + MIN_SHARE)].tolist())
            by_head.setdefault(head if n - end > MIN_SHARE else (-1 - m,), []).append(m)
        for sub in by_head.values():
            if len(sub) > 1:
                lead = self.ids_N[self.starts[sub[0]] + end : self.starts[sub[0]] + self.lengths[sub[0]]]
                p = min(
                    common_length(lead, self.ids_N[self.starts[m] + end : self.starts[m] + self.lengths[m]])
                    for m in sub[1:]
                )
                if p - 1 >= MIN_SHARE:
                    self.node(sub, end, end + p - 1, below)
                    continue
            for m in sub:
                at = self.offset
                self._run(m, end, self.lengths[m], below)
                n = self.lengths[m] - end
                self.source_N[self.starts[m] + end : self.starts[m] + self.lengths[m]] = torch.arange(at, at + n)
                self.offset += n
