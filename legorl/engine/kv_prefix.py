"""Prefilled prompts' and finished requests' KV columns, kept for requests that start with the same tokens.

An agent's next turn is its last prompt, its completion and the tool's output: without
reuse the `hf` engine prefills the whole transcript again on every turn, and the sessions
of one harness all start with its system prompt and tool list; on a CPU that prefill is
most of an evaluation's time (SmolLM2-135M prefills ~200-400 tokens/s on
2 cores). A token's key and value depend only on the tokens before it and the weights, so
the first `m` columns of a finished row are exactly what a prefill of any prompt that
shares those `m` tokens would compute (up to float rounding of a different batch shape).

The store is cleared whenever the weights change (`HFEngine.load_state_dict`): a column
computed by the previous policy is not the new policy's, and a trajectory whose prefix
came from older weights would be recorded under a version that did not produce it.
Models with linear-attention layers (Qwen3.5's Gated-DeltaNet) keep a recurrent state per
row, not columns, and a state cannot be cut back to `m` tokens: the engine does not reuse
for them, nor while it records MoE routing (a reused prefix would have no routed experts).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class Prefix:
    """A finished row's cached tokens and, per layer, their keys and values (H, L, D)."""

    ids: tuple[int, ...]
    keys_H_L_D: list[torch.Tensor]
    values_H_L_D: list[torch.Tensor]
    ids_N: np.ndarray = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    """`ids` as an int64 array, what prompts are compared against (built from `ids` if not given)."""

    def __post_init__(self) -> None:
        if self.ids_N is None:
            object.__setattr__(self, "ids_N", id_array(self.ids))

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys_H_L_D) + sum(t.nbytes for t in self.values_H_L_D)


def id_array(ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as a 1-D int64 array (the array itself if it already is one)."""
    if isinstance(ids, np.ndarray) and ids.dtype == np.int64:
        return ids
    return np.asarray(ids, dtype=np.int64)


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """How many leading ids `a` and `b` share, in one vectorised pass: a harness's prompt is
    15-30k ids, compared against every stored prefix at each admission (19 prefixes of Codex's
    27.5k ids: 5.5 ms a match compared 64 ids at a time in Python, 2.3 ms so)."""
    a_N, b_N = id_array(a), id_array(b)
    n = min(len(a_N), len(b_N))
    differ_N = a_N[:n] != b_N[:n]
    first = int(differ_N.argmax()) if n else 0
    return first if n and differ_N[first] else n


class PrefixStore:
    """At most `max_tokens` cached columns and `max_bytes` of them, least recently used evicted first.

    Both bounds, because a column's size differs by four orders of magnitude between models:
    32k columns of the quickstart's model are ~30 MB, of SmolLM2-135M (30 layers, fp32) 1.5 GB,
    held on top of the trainer's memory for as long as the weights do not change.

    A match is only worth its copy from `min_reuse` tokens on, and it never covers a whole
    prompt: the prompt's last token must still be forwarded to give the next token's logits."""

    def __init__(self, max_tokens: int, min_reuse: int = 16, max_bytes: int | None = None) -> None:
        self.max_tokens = max_tokens
        self.max_bytes = max_bytes if max_bytes is not None else 1 << 62
        self.min_reuse = min_reuse
        self._entries: OrderedDict[tuple[int, ...], Prefix] = OrderedDict()
        self._tokens = 0
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = self._bytes = 0

    def put(self, prefix: Prefix) -> None:
        """Keep `prefix`; drop entries it extends (they hold nothing it does not)."""
        n, size = len(prefix.ids), prefix.nbytes
        if n < self.min_reuse or n > self.max_tokens or size > self.max_bytes:
            return
        extended = [
            k for k, e in self._entries.items() if len(k) <= n and common_prefix(e.ids_N, prefix.ids_N) >= len(k)
        ]
        for ids in extended:
            self._drop(ids)
        self._entries[prefix.ids] = prefix
        self._tokens += n
        self._bytes += size
        while self._tokens > self.max_tokens or self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def match(self, prompt: Sequence[int] | np.ndarray) -> tuple[Prefix, int] | None:
        """The entry sharing the longest prefix with `prompt`, and how many of its columns to reuse."""
        best: tuple[Prefix, int] | None = None
        prompt_N = id_array(prompt)
        for entry in self._entries.values():
            m = min(common_prefix(entry.ids_N, prompt_N), len(prompt_N) - 1)
            if m >= self.min_reuse and (best is None or m > best[1]):
                best = (entry, m)
        if best is not None:
            self._entries.move_to_end(best[0].ids)
        return best

    def _drop(self, ids: tuple[int, ...]) -> None:
        gone = self._entries.pop(ids)
        self._tokens -= len(gone.ids)
        self._bytes -= gone.nbytes
