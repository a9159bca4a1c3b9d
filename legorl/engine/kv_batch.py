"""A left-padded, batched KV cache for continuous batching with a plain transformers model.

Rows (one per running request) share one `DynamicCache` of shape (B, heads, S, dim) per
layer. Each row's cached tokens are its last `L_r` columns (left padding before them),
so a decode step appends one column to every row at once. When rows join or leave, the
batch is regrouped: the surviving rows are cut to the longest row and re-padded on the
left. Regrouping costs one copy of the cache; decode steps between regroupings cost
nothing extra, which is why requests that finish or arrive do not slow the others.

Full-attention layers are `GrowingLayer`s: their keys and values live in a buffer with spare
columns, and a decode step writes its column in place. transformers' `DynamicLayer` concatenates
instead, copying the whole cache on every token: with SmolLM2-135M at 32 rows x 600 columns on
2 CPU cores that copy was 64% of a decode step (0.52 s), more than all the matmuls together.

Attention uses our own 4-D additive mask (0 = attend, dtype-min = masked), so padding is
handled identically by the eager and SDPA kernels, and a padded query row (which sees no
valid key) stays finite instead of producing NaNs.

Models whose layers are not all full attention get one mask per layer type, as transformers
builds them itself: `sliding_attention` layers (gpt-oss) the same mask cut to their window, and
`linear_attention` layers (Qwen3.5's Gated-DeltaNet) the 2-D padding mask of the columns being
fed, which zeroes padded inputs before the convolution and the recurrence. Zero inputs leave
a zero recurrent state zero and are what the causal convolution pads with anyway, so a
left-padded row's state after its padding is exactly that of an unpadded prefill. Those
layers cache a fixed-size (conv, recurrent) state per row, not columns: regrouping selects
their rows and nothing else.

Windows: where a model has any full-attention layer (gpt-oss alternates), the cache keeps every
column and the mask, not the cache, bounds what a sliding layer sees. Where every layer is a
sliding-window layer (`BatchedForward.keep`), a query at position i sees only keys j with
i - j < window (transformers' `sliding_window_overlay`), so no later query can see a column more
than `window` back: `regroup` cuts every row to its last `window` columns, and a prefill that
reuses a stored prefix copies only the last `window` of its columns. Regrouping, masks, decode
attention and cache growth then work over ~window + turn columns, not the whole transcript
(a Claude Code rollout's ~6.5k). Positions stay absolute: decode is given each row's true
position, and `KVBatch.dropped_B` counts the leading tokens a row's cache no longer holds.
Such a row is not stored as a prefix (`row_prefix`: a stored prefix holds every token's
columns); prompts are stored at prefill, before any cut, so a later turn still reuses them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin, LinearAttentionLayer

from legorl.engine.kv_prefix import Prefix, id_array


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer that appends in place into a buffer with spare columns.

    `keys` / `values` are views of the first `length` columns of the buffer, so everything that
    reads a `DynamicLayer` (masks, regrouping, `get_seq_length`) reads this one unchanged. The
    buffer grows by at least `HEADROOM` columns (or a quarter) when full: one copy per that many
    decode steps instead of one per step."""

    HEADROOM = 128

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._keys_buf, self._values_buf = key_states[..., :0, :], value_states[..., :0, :]
        self._length = 0

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys, self.values = self._keys_buf[..., : self._length, :], self._values_buf[..., : self._length, :]
        return self.keys, self.values

    @staticmethod
    def _grown(old: torch.Tensor, length: int, cap: int) -> torch.Tensor:
        buf = old.new_empty((*old.shape[:-2], cap, old.shape[-1]))
        buf[..., :length, :] = old[..., :length, :]
        return buf

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._length, self._length + key_states.shape[-2]
        if end > self._keys_buf.shape[-2]:
            cap = end + max(self.HEADROOM, end // 4)
            self._keys_buf = self._grown(self._keys_buf, start, cap)
            self._values_buf = self._grown(self._values_buf, start, cap)
        self._keys_buf[..., start:end, :] = key_states
        self._values_buf[..., start:end, :] = value_states
        self._length = end
        return self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._keys_buf, self._values_buf = self._keys_buf[indices], self._values_buf[indices]
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        """As `DynamicLayer.crop`: a negative count drops that many of the last columns."""
        if tokens_to_remove > 0:
            super().crop(tokens_to_remove)  # refused there, with transformers' own message
        if tokens_to_remove < 0 and self.is_initialized:
            self._length = max(0, self._length + tokens_to_remove)
            self._views()


def _growing(cache: DynamicCache) -> DynamicCache:
    """`cache` with its full-attention layers (plain `DynamicLayer`s) as `GrowingLayer`s."""
    if cache.layer_class_to_replicate is DynamicLayer:
        cache.layer_class_to_replicate = GrowingLayer
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@dataclass
class KVBatch:
    """The cache of the running rows and which of its columns hold real tokens."""

    cache: DynamicCache
    valid_B_S: torch.Tensor  # bool; row r's cached tokens are its last valid_B_S[r].sum() columns
    dropped_B: torch.Tensor | None = None  # long; how many of row r's first tokens were cut (zeros if None)

    def __post_init__(self) -> None:
        if self.dropped_B is None:
            self.dropped_B = torch.zeros(self.rows, dtype=torch.long, device=self.valid_B_S.device)

    @property
    def rows(self) -> int:
        return int(self.valid_B_S.shape[0])


def cache_kwarg(model: nn.Module) -> str:
    """The forward() keyword of the KV cache: `cache` (transformers ≥ 5.2x) or `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def additive_mask(valid_B_S: torch.Tensor, q_len: int, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
    """(B, 1, q_len, S) mask: query i (the i-th of the last q_len columns) sees valid keys ≤ it
    (and, with `window`, only the last `window` of them, itself included)."""
    S = valid_B_S.shape[1]
    causal_Q_S = torch.ones(q_len, S, dtype=torch.bool, device=valid_B_S.device).tril(diagonal=S - q_len)
    if window is not None:
        causal_Q_S &= ~torch.ones_like(causal_Q_S).tril(diagonal=S - q_len - window)
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
        self.reused_columns = 0  # prompt columns copied from stored prefixes instead of computed
        text_config = model.config.get_text_config(decoder=True)
        types = set(getattr(text_config, "layer_types", None) or ["full_attention"])
        unknown = types - {"full_attention", "sliding_attention", "linear_attention"}
        if unknown:
            raise ValueError(f"hf engine: layer types {sorted(unknown)} are not supported (full, sliding, linear)")
        self.layer_types = types
        self.window = getattr(text_config, "sliding_window", None) if "sliding_attention" in types else None
        # every layer windowed: rows need no more than their last `window` columns (None: keep all;
        # benchmarks set it to None to compare)
        self.keep: int | None = self.window if types == {"sliding_attention"} and self.window else None
        self._config = model.config if "linear_attention" in types else None  # hybrid: per-layer cache types

    def new_cache(self) -> DynamicCache:
        """An empty cache: linear-attention layers need their own (state) layer type."""
        return _growing(DynamicCache(config=self._config) if self._config is not None else DynamicCache())

    def masks(self, valid_B_S: torch.Tensor, q_len: int) -> torch.Tensor | dict[str, torch.Tensor | None]:
        """The attention mask of a forward of the last `q_len` columns (one per layer type)."""
        if self.layer_types == {"full_attention"}:
            return additive_mask(valid_B_S, q_len, self.dtype)
        out: dict[str, torch.Tensor | None] = {}
        if "full_attention" in self.layer_types:
            out["full_attention"] = additive_mask(valid_B_S, q_len, self.dtype)
        if "sliding_attention" in self.layer_types:
            out["sliding_attention"] = additive_mask(valid_B_S, q_len, self.dtype, self.window)
        if "linear_attention" in self.layer_types:
            fed_B_Q = valid_B_S[:, -q_len:]
            out["linear_attention"] = None if q_len == 1 or bool(fed_B_Q.all()) else fed_B_Q.to(self.dtype)
        return out

    def _run(
        self, ids_B_T: torch.Tensor, valid_B_S: torch.Tensor, pos_B_T: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        self.forward_calls += 1
        out = self.model(
            input_ids=ids_B_T,
            attention_mask=self.masks(valid_B_S, ids_B_T.shape[1]),
            position_ids=pos_B_T,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        return out.logits[:, -1, :]

    def prefill(
        self, prompts: list[list[int]], chunk: int = 1024, reused: list[tuple[Prefix, int] | None] | None = None
    ) -> tuple[KVBatch, torch.Tensor]:
        """Forward the prompts as one left-padded batch, `chunk` columns per forward (so a
        long prompt never materialises a P x P mask); the new batch and next-token logits.

        `reused[r]` = (a stored prefix, m): row r's first m tokens are that prefix's, and
        their columns are copied in instead of computed. One forward covers every row's
        columns from the longest remaining suffix on, so a row whose suffix is shorter
        computes a few of its prefix's columns again (the engine groups rows that reuse
        apart from rows that do not). With `keep` (every layer windowed) only the last `keep`
        reused columns are copied: the forward's queries see no further back."""
        P = max(len(p) for p in prompts)
        ids_B_T = torch.zeros(len(prompts), P, dtype=torch.long)
        valid_B_S = torch.zeros(len(prompts), P, dtype=torch.bool)
        for r, p in enumerate(prompts):
            ids_B_T[r, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            valid_B_S[r, P - len(p) :] = True
        ids_B_T, valid_B_S = ids_B_T.to(self.device), valid_B_S.to(self.device)
        pos_B_T = (valid_B_S.long().cumsum(1) - 1).clamp(min=0)
        cache = self.new_cache()
        lo, C = self._fill_reused(cache, prompts, reused, P) if reused and any(reused) else (0, 0)
        for start in range(C, P, chunk):
            end = min(P, start + chunk)
            logits_B_V = self._run(ids_B_T[:, start:end], valid_B_S[:, lo:end], pos_B_T[:, start:end], cache)
        first_B = torch.tensor([P - len(p) for p in prompts], dtype=torch.long, device=self.device)
        return KVBatch(cache, valid_B_S[:, lo:], (lo - first_B).clamp(min=0)), logits_B_V

    def _fill_reused(
        self, cache: DynamicCache, prompts: list[list[int]], reused: list[tuple[Prefix, int] | None], P: int
    ) -> tuple[int, int]:
        """Write the reused columns into `cache`: (lo, C), it then holds columns lo..C of the P.

        Each row's tokens are its last len(p) of the P columns; the forward starts at column
        C = P - (longest suffix), so row r contributes its first len(p) - (P - C) tokens,
        right-aligned in the first C columns (never more than it reuses: its own suffix is no
        longer than the longest). lo is 0, or C - keep where every layer is windowed."""
        Q = max(len(p) - (ru[1] if ru else 0) for p, ru in zip(prompts, reused, strict=True))
        C = P - Q
        if C <= 0:
            return 0, 0
        lo = max(0, C - self.keep) if self.keep else 0
        first = next(ru[0] for ru in reused if ru)
        for layer, (k_H_L_D, v_H_L_D) in enumerate(zip(first.keys_H_L_D, first.values_H_L_D, strict=True)):
            keys_B_H_W_D = k_H_L_D.new_zeros((len(prompts), k_H_L_D.shape[0], C - lo, k_H_L_D.shape[2]))
            values_B_H_W_D = v_H_L_D.new_zeros((len(prompts), v_H_L_D.shape[0], C - lo, v_H_L_D.shape[2]))
            for r, (p, ru) in enumerate(zip(prompts, reused, strict=True)):
                use = len(p) - Q  # the row's reused tokens, ending at column C
                n = min(use, C - lo)  # of which the cache holds the last n
                if ru and n > 0:
                    keys_B_H_W_D[r, :, C - lo - n :] = ru[0].keys_H_L_D[layer][:, use - n : use]
                    values_B_H_W_D[r, :, C - lo - n :] = ru[0].values_H_L_D[layer][:, use - n : use]
            cache.update(keys_B_H_W_D, values_B_H_W_D, layer)
        self.reused_columns += sum(len(p) - Q for p, ru in zip(prompts, reused, strict=True) if ru and len(p) > Q)
        return lo, C

    def reusable(self) -> bool:
        """Whether a row's columns can be cut back and reused (not with linear-attention state)."""
        return "linear_attention" not in self.layer_types

    def decode(self, batch: KVBatch, tokens_B: list[int], positions_B: list[int]) -> torch.Tensor:
        """Append one token per row; next-token logits (B, V). `batch` is updated in place."""
        ids_B_T = torch.tensor(tokens_B, dtype=torch.long, device=self.device)[:, None]
        pos_B_T = torch.tensor(positions_B, dtype=torch.long, device=self.device)[:, None]
        ones_B_1 = torch.ones(batch.rows, 1, dtype=torch.bool, device=self.device)
        batch.valid_B_S = torch.cat([batch.valid_B_S, ones_B_1], dim=1)
        return self._run(ids_B_T, batch.valid_B_S, pos_B_T, batch.cache)


def row_prefix(batch: KVBatch, r: int, tokens: list[int], reused: tuple[Prefix, int] | None = None) -> Prefix | None:
    """Row r's cached columns as a stored prefix of its `tokens` (the cache holds all but the
    last sampled one), copied out so the batch's buffers are not kept alive by it.

    A stored prefix holds the columns of every one of its tokens. A row cut to its window
    (every layer windowed) holds only its last ones: right after a prefill that `reused` a
    stored prefix's first m tokens (`tokens` its prompt, every one of them cached or cut), the
    leading columns are that prefix's, so a reused prompt is kept whole and the next turn
    reuses all of it, not only what it shared with the prefix. None if the row was cut and
    the reused tokens do not cover what it lost."""
    assert batch.dropped_B is not None
    n = min(int(batch.valid_B_S[r].sum()), len(tokens))
    head = int(batch.dropped_B[r])
    if head > 0 and (reused is None or head + n != len(tokens) or reused[1] < head):
        return None
    keys = [layer.keys[r, :, layer.keys.shape[-2] - n :].clone() for layer in batch.cache.layers]
    values = [layer.values[r, :, layer.values.shape[-2] - n :].clone() for layer in batch.cache.layers]
    if head > 0:
        assert reused is not None
        base = reused[0]
        keys = [torch.cat([b[:, :head], k], dim=1) for b, k in zip(base.keys_H_L_D, keys, strict=True)]
        values = [torch.cat([b[:, :head], v], dim=1) for b, v in zip(base.values_H_L_D, values, strict=True)]
    ids = tokens[: head + n]
    return Prefix(tuple(ids), keys, values, id_array(ids))


def regroup(parts: list[tuple[KVBatch, list[int]]], keep: int | None = None) -> KVBatch | None:
    """A new batch of the listed rows of each part, in order, cut to its longest row (and to
    `keep` columns: every layer windowed, see the module's docstring)."""
    parts = [(b, rows) for b, rows in parts if rows]
    if not parts:
        return None
    S = max(int(b.valid_B_S[rows].sum(1).max()) for b, rows in parts)
    S = min(S, keep) if keep is not None else S
    num_layers = len(parts[0][0].cache.layers)

    def cut(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Rows of `t` (.., S_part on dim 2 or 1) as their last S columns, left-padded."""
        dim = t.dim() - 2 if t.dim() == 4 else 1
        # cut, then select: a prefill's rows hold whole prompts, of which S columns are kept
        t = t.narrow(dim, max(0, t.shape[dim] - S), min(S, t.shape[dim]))[rows]
        if t.shape[dim] < S:
            shape = list(t.shape)
            shape[dim] = S - t.shape[dim]
            t = torch.cat([t.new_zeros(shape), t], dim=dim)
        return t

    valid_B_S = torch.cat([cut(b.valid_B_S, rows) for b, rows in parts], dim=0)
    held_B = torch.cat([b.valid_B_S[rows].sum(1) + b.dropped_B[rows] for b, rows in parts])  # type: ignore[index]
    dropped_B = held_B - valid_B_S.sum(1)
    cache = _growing(DynamicCache())
    if any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in parts[0][0].cache.layers):
        cache.layers = [
            _regroup_layer([(b.cache.layers[i], rows) for b, rows in parts], cut) for i in range(num_layers)
        ]
        return KVBatch(cache, valid_B_S, dropped_B)
    for layer in range(num_layers):
        keys = torch.cat([cut(b.cache.layers[layer].keys, rows) for b, rows in parts], dim=0)
        values = torch.cat([cut(b.cache.layers[layer].values, rows) for b, rows in parts], dim=0)
        cache.update(keys, values, layer)
    return KVBatch(cache, valid_B_S, dropped_B)


def _regroup_layer(parts, cut):  # type: ignore[no-untyped-def]
    """One layer of a hybrid cache: a state layer's rows, or a KV layer's rows cut to S columns."""
    first = parts[0][0]
    if not isinstance(first, LinearAttentionCacheLayerMixin):
        out = GrowingLayer()
        keys = torch.cat([cut(la.keys, rows) for la, rows in parts])
        out.update(keys, torch.cat([cut(la.values, rows) for la, rows in parts]))
        return out
    out = LinearAttentionLayer(number_of_states=first.number_of_states)
    for i in range(first.number_of_states):
        conv = [la.conv_states[i] for la, _ in parts]
        recurrent = [la.recurrent_states[i] for la, _ in parts]
        if all(t is not None for t in conv):
            out.conv_states[i] = torch.cat([t[rows] for t, (_, rows) in zip(conv, parts, strict=True)])
            out.is_conv_states_initialized[i] = True
        if all(t is not None for t in recurrent):
            out.recurrent_states[i] = torch.cat([t[rows] for t, (_, rows) in zip(recurrent, parts, strict=True)])
            out.is_recurrent_states_initialized[i] = True
        out.has_previous_state[i] = all(la.has_previous_state[i] for la, _ in parts)
        out.conv_kernel_size[i] = first.conv_kernel_size[i]
    out.device, out.dtype = first.device, first.dtype
    return out
