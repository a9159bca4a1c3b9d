"""Compact, self-describing byte encodings for the token-level arrays in the run store.

Why not JSON: a 30k-token prompt as a JSON list is ~200 kB of text per turn, and an MoE
routing tensor (tokens x layers x top-k) is tens of MB. Token ids go in as int32 and
routing as the smallest unsigned type that holds the expert indices, both zlib'd (ids
repeat a lot, expert indices are small); log-probabilities go in as raw float32 (they do
not compress, and float32 is already finer than the bf16/fp32 the engines compute in).

Prompt deltas: within a segment each prompt extends the previous prompt + completion
token-for-token, so storing every prompt in full makes a run's size quadratic in its
turn count. `common_prefix_len` lets the store keep only the new tail of each prompt and
rebuild the full one by walking back (see run_store.py).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np

_ZLEVEL = 1  # fast: the writer sits on the proxy's hot path


def pack_ids(ids: Sequence[int] | np.ndarray) -> bytes:
    """int32 + zlib. Token ids, loss masks and policy versions all fit in int32."""
    return zlib.compress(np.asarray(ids, dtype=np.int32).tobytes(), _ZLEVEL)


def unpack_ids(blob: bytes | None) -> np.ndarray:
    if not blob:
        return np.zeros(0, dtype=np.int32)
    return np.frombuffer(zlib.decompress(blob), dtype=np.int32)


def pack_floats(values: Sequence[float] | np.ndarray) -> bytes:
    """Raw little-endian float32 (log-probabilities do not compress)."""
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_floats(blob: bytes | None) -> np.ndarray:
    if not blob:
        return np.zeros(0, dtype=np.float32)
    return np.frombuffer(blob, dtype="<f4")


_ROUTING_DTYPES = {b"B": np.uint8, b"H": np.uint16, b"I": np.int32}


def pack_routing(routed: Sequence[Sequence[Sequence[int]]] | np.ndarray | None) -> bytes | None:
    """(tokens, layers, top_k) expert indices → header(dtype, 3 dims) + zlib'd array.

    uint8 when there are at most 256 experts (the common case; SGLang plans the same),
    uint16 up to 65536, int32 beyond. A ragged list (which no engine should produce) is a
    ValueError naming the problem rather than a silently mangled array.
    """
    if routed is None:
        return None
    try:
        arr_T_L_K = np.asarray(routed)
    except ValueError as e:  # ragged nesting
        raise ValueError(f"routed_experts must be a rectangular (tokens, layers, top_k) array: {e}") from e
    if arr_T_L_K.size == 0:
        arr_T_L_K = arr_T_L_K.reshape(0, 0, 0)
    if arr_T_L_K.ndim != 3:
        raise ValueError(f"routed_experts must have shape (tokens, layers, top_k), got {arr_T_L_K.shape}")
    top = int(arr_T_L_K.max()) if arr_T_L_K.size else 0
    code = b"B" if top < 256 else (b"H" if top < 65536 else b"I")
    body = arr_T_L_K.astype(_ROUTING_DTYPES[code]).tobytes()
    return code + struct.pack("<3I", *arr_T_L_K.shape) + zlib.compress(body, _ZLEVEL)


def unpack_routing(blob: bytes | None) -> np.ndarray | None:
    if not blob:
        return None
    code, shape = blob[:1], struct.unpack("<3I", blob[1:13])
    return np.frombuffer(zlib.decompress(blob[13:]), dtype=_ROUTING_DTYPES[code]).reshape(shape)


def pack_text(text: str) -> bytes:
    """zlib'd UTF-8: raw requests repeat system prompts and tool schemas verbatim."""
    return zlib.compress(text.encode(), 6)


def unpack_text(blob: bytes | None) -> str:
    return zlib.decompress(blob).decode() if blob else ""


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D integer arrays (vectorised)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    neq = np.flatnonzero(a[:n] != b[:n])
    return int(neq[0]) if len(neq) else n
