"""A left-padded, batched KV cache for continuous batching with a plain transformers model.

Rows (one per running request) share one `DynamicCache` of shape (B, heads, S, dim) per
layer. Each row's cached tokens are its last `L_r` columns (left padding before them),
so a decode step appends one column to every row at once. When rows join or leave, the
batch is regrouped: the surviving rows are cut to the longest row and re-padded on the
left. Regrouping costs one copy of the cache; decode steps between regroupings cost
nothing extra, which is why requests that finish or arrive do not slow the others.

Attention uses our own 4-D additive mask (0 = attend, dtype-min = masked), so padding is
handled identically by the eager and SDPA kernels, and a padded query row (which sees no
valid key) stays finite instead of producing NaNs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache


@dataclass
class KVBatch:
    """The cache of the running rows and which of its columns hold real tokens."""

    cache: DynamicCache
    valid_B_S: torch.Tensor  # bool; row r's real tokens are its last valid_B_S[r].sum() columns

    @property
    def rows(self) -> int:
        return int(self.valid_B_S.shape[0])


def cache_kwarg(model: nn.Module) -> str:
    """The forward() keyword of the KV cache: `cache` (transformers ≥ 5.2x) or `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def additive_mask(valid_B_S: torch.Tensor, q_len: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, q_len, S) mask: query i (the i-th of the last q_len columns) sees valid keys ≤ it."""
    S = valid_B_S.shape[1]
    causal_Q_S = torch.ones(q_len, S, dtype=torch.bool, device=valid_B_S.device).tril(diagonal=S - q_len)
    allowed_B_Q_S = causal_Q_S[None] & valid_B_S[:, None, :]
    mask = torch.zeros(allowed_B_Q_S.shape, dtype=dtype, device=valid_B_S.device)
    return mask.masked_fill_(~allowed_B_Q_S, torch.finfo(dtype).min)[:, None]


class BatchedForward:
    """Runs prefill and decode forwards of one model over left-padded batches."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._cache_kw = cache_kwarg(model)
        self.forward_calls = 0

    def _run(self, ids_B_T: torch.Tensor, valid_B_S: torch.Tensor, pos_B_T: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        self.forward_calls += 1
        out = self.model(
            input_ids=ids_B_T,
            attention_mask=additive_mask(valid_B_S, ids_B_T.shape[1], self.dtype),
            position_ids=pos_B_T,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        return out.logits[:, -1, :]

    def prefill(self, prompts: list[list[int]], chunk: int = 1024) -> tuple[KVBatch, torch.Tensor]:
        """Forward the prompts as one left-padded batch, `chunk` columns per forward (so a
        long prompt never materialises a P x P mask); the new batch and next-token logits."""
        P = max(len(p) for p in prompts)
        ids_B_T = torch.zeros(len(prompts), P, dtype=torch.long)
        valid_B_S = torch.zeros(len(prompts), P, dtype=torch.bool)
        for r, p in enumerate(prompts):
            ids_B_T[r, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            valid_B_S[r, P - len(p) :] = True
        ids_B_T, valid_B_S = ids_B_T.to(self.device), valid_B_S.to(self.device)
        pos_B_T = (valid_B_S.long().cumsum(1) - 1).clamp(min=0)
        cache = DynamicCache()
        for start in range(0, P, chunk):
            end = min(P, start + chunk)
            logits_B_V = self._run(ids_B_T[:, start:end], valid_B_S[:, :end], pos_B_T[:, start:end], cache)
        return KVBatch(cache, valid_B_S), logits_B_V

    def decode(self, batch: KVBatch, tokens_B: list[int], positions_B: list[int]) -> torch.Tensor:
        """Append one token per row; next-token logits (B, V). `batch` is updated in place."""
        ids_B_T = torch.tensor(tokens_B, dtype=torch.long, device=self.device)[:, None]
        pos_B_T = torch.tensor(positions_B, dtype=torch.long, device=self.device)[:, None]
        ones_B_1 = torch.ones(batch.rows, 1, dtype=torch.bool, device=self.device)
        batch.valid_B_S = torch.cat([batch.valid_B_S, ones_B_1], dim=1)
        return self._run(ids_B_T, batch.valid_B_S, pos_B_T, batch.cache)


def regroup(parts: list[tuple[KVBatch, list[int]]]) -> KVBatch | None:
    """A new batch of the listed rows of each part, in order, cut to its longest row."""
    parts = [(b, rows) for b, rows in parts if rows]
    if not parts:
        return None
    S = max(int(b.valid_B_S[rows].sum(1).max()) for b, rows in parts)
    num_layers = len(parts[0][0].cache.layers)

    def cut(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Rows of `t` (.., S_part on dim 2 or 1) as their last S columns, left-padded."""
        dim = t.dim() - 2 if t.dim() == 4 else 1
        t = t[rows].narrow(dim, max(0, t.shape[dim] - S), min(S, t.shape[dim]))
        if t.shape[dim] < S:
            shape = list(t.shape)
            shape[dim] = S - t.shape[dim]
            t = torch.cat([t.new_zeros(shape), t], dim=dim)
        return t

    valid_B_S = torch.cat([cut(b.valid_B_S, rows) for b, rows in parts], dim=0)
    cache = DynamicCache()
    for layer in range(num_layers):
        keys = torch.cat([cut(b.cache.layers[layer].keys, rows) for b, rows in parts], dim=0)
        values = torch.cat([cut(b.cache.layers[layer].values, rows) for b, rows in parts], dim=0)
        cache.update(keys, values, layer)
    return KVBatch(cache, valid_B_S)
