"""Bounded render caches, and rendering huge prompts off the event loop.

`chatml_renderer.ChatMLRenderer` caches the token ids of every message block and tool schema it renders,
capped by *entries* (50,000 blocks, 1,024 tool sets); `template.TemplateRenderer` (the
model's own Jinja template) the ids of every text piece between added tokens (`_cache`,
50,000 pieces, no tools cache). A few multi-megabyte prompts fill that with gigabytes, and
a prompt that is then refused as too long stays cached. This module keeps the renderers
untouched and bounds them from the caller, whichever of the two caches they have:

- `bound_renderer` swaps the renderer's caches for `ByteLRU`s that also evict by an
  estimate of their bytes (`ProxyConfig.render_cache_bytes`, split 7:1 blocks:tools when
  there are both, all of it for `_cache` alone).
- `Journal` (requests rendered on the loop): the keys a render inserts are noted, and
  dropped again when the prompt is refused, so a refused prompt caches nothing there either
  (cost: one list append per cache miss).
- `OffLoopRenderer.run` renders a large request on a worker thread with a *shadow* of
  the renderer whose caches read the shared ones but write into private overlays, and
  tokenises with `encode_batch_fast` (the Rust work runs without the GIL, and skips the
  offsets nobody reads: ~2.5x faster on 5 MB). Only when the caller accepts the prompt
  are the overlays merged into the shared caches, on the loop thread: a refused prompt
  caches nothing, and the shared caches are only ever written by one thread.

After a large request, `trim()` hands freed heap back to the OS (glibc `malloc_trim`, on
the worker thread): a 5 MB prompt's transient ~100 MB would otherwise stay in the process's
RSS as free-but-kept arenas (measured: ~+200 MB plateau without, ~+30 MB with).

A renderer without the expected `_cache` / `_fast` attributes (another renderer) still
works: it is rendered on the thread as is, unbounded by this module.
"""

from __future__ import annotations

import asyncio
import copy
import ctypes
import ctypes.util
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from legorl.proxy.renderer import Renderer

T = TypeVar("T")

_ENTRY_OVERHEAD = 120  # dict slot, key tuple, list header
_ID_BYTES = 36  # a list slot plus an int object (ids above 256 are not shared)


def estimate_bytes(key: Any, value: Any) -> int:
    """A cheap estimate of what a cache entry holds: its strings and its ids."""
    n = _ENTRY_OVERHEAD
    for part in (key, value):
        if isinstance(part, (str, bytes)):
            n += len(part)
        elif isinstance(part, (tuple, list)):
            if part and isinstance(part[0], int):
                n += _ID_BYTES * len(part)
            else:
                for x in part:
                    if isinstance(x, (str, bytes)):
                        n += len(x)
                    elif isinstance(x, (tuple, list)):
                        n += sum(len(y) if isinstance(y, (str, bytes)) else 8 for y in x)
                    else:
                        n += 8
    return n


class ByteLRU(OrderedDict):
    """An LRU dict that also evicts its oldest entries past `max_bytes` (estimated).

    An OrderedDict subclass (not a wrapper) so that the renderer's hits — `get` and
    `move_to_end` — stay the C implementation; only inserts pay for the accounting."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._sizes: dict[Any, int] = {}
        self.journal: list[Any] | None = None  # keys inserted since `Journal` began

    def __setitem__(self, key: Any, value: Any) -> None:
        size = estimate_bytes(key, value)
        if size > self.max_bytes // 4:  # one block may not take a quarter of the budget
            return
        if self.journal is not None:
            self.journal.append(key)
        old = self._sizes.get(key)
        if old is not None:
            self.nbytes -= old
        super().__setitem__(key, value)
        self._sizes[key] = size
        self.nbytes += size
        while self.nbytes > self.max_bytes and len(self) > 1:
            self.popitem(last=False)

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self.nbytes -= self._sizes.pop(key, 0)

    def popitem(self, last: bool = True) -> tuple[Any, Any]:
        key, value = super().popitem(last=last)
        self.nbytes -= self._sizes.pop(key, 0)
        return key, value

    def clear(self) -> None:
        super().clear()
        self._sizes.clear()
        self.nbytes = 0


CACHES = ("_cache", "_tools_cache")  # the renderers' cache attributes (blocks/pieces, tool sets)


def _caches(renderer: Renderer) -> dict[str, dict]:
    return {name: c for name in CACHES if isinstance(c := getattr(renderer, name, None), dict)}


def bound_renderer(renderer: Renderer, max_bytes: int) -> bool:
    """Replace the renderer's caches by ByteLRUs (keeping what they hold); False when the
    renderer has no `_cache`."""
    caches = _caches(renderer)
    if "_cache" not in caches:
        return False
    budgets = (
        {"_cache": max_bytes - max_bytes // 8, "_tools_cache": max_bytes // 8}
        if len(caches) > 1
        else {"_cache": max_bytes}
    )
    for name, cache in caches.items():
        if not isinstance(cache, ByteLRU):
            new = ByteLRU(budgets[name])
            for k, v in cache.items():
                new[k] = v
            setattr(renderer, name, new)
    return True


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


class Journal:
    """Notes what a render on the loop inserts into the renderer's ByteLRUs; `rollback()`
    removes it (the prompt was refused), `end()` keeps it."""

    def __init__(self, renderer: Renderer) -> None:
        self.caches = [c for c in _caches(renderer).values() if isinstance(c, ByteLRU)]
        for c in self.caches:
            c.journal = []

    def rollback(self) -> None:
        for c in self.caches:
            for key in c.journal or ():
                if key in c:
                    del c[key]
        self.end()

    def end(self) -> None:
        for c in self.caches:
            c.journal = None


class _Overlay(dict):
    """Reads fall through to the shared cache; writes stay here until merged."""

    def __init__(self, shared: dict) -> None:
        super().__init__()
        self.shared = shared

    def get(self, key: Any, default: Any = None) -> Any:
        v = dict.get(self, key)
        return self.shared.get(key, default) if v is None else v

    def move_to_end(self, key: Any, last: bool = True) -> None:  # LRU order is the shared cache's
        return None

    def popitem(self, last: bool = True) -> tuple[Any, Any]:
        return dict.popitem(self)


class TooLong(Exception):
    """One piece of the prompt alone has `n_tokens` ≥ the token budget: the whole prompt is
    over the context window (it has at least that many tokens), so rendering stops there."""

    def __init__(self, n_tokens: int) -> None:
        super().__init__(n_tokens)
        self.n_tokens = n_tokens


class _FastEncode:
    """`tokenizers.Tokenizer.encode` through `encode_batch_fast`: same ids, GIL released.

    With a `budget`, a piece of that many tokens or more raises `TooLong` before its ids
    become a Python list: turning a 5 MB prompt's 3.5 M ids into ints holds the GIL for
    ~55 ms (measured, idle-equivalent CPU time), i.e. stalls the event loop, and freeing
    them on the loop costs as much again — for a prompt that is then refused anyway."""

    def __init__(self, inner: Any, budget: int | None = None) -> None:
        self.inner, self.budget = inner, budget

    def encode(self, text: str, add_special_tokens: bool = False) -> Any:
        enc = self.inner.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0]
        if self.budget is not None and len(enc) >= self.budget:
            raise TooLong(len(enc))
        return enc


class OffLoopRenderer:
    """Renders requests on worker threads; see the module docstring."""

    def __init__(self, renderer: Renderer, workers: int = 2) -> None:
        self.renderer = renderer
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="legorl-render")
        self.shadowable = "_cache" in _caches(renderer) and hasattr(renderer, "_fast")
        self._malloc_trim = _libc_malloc_trim()
        self._last_trim = 0.0
        self._trim_pending = False

    def trim(self) -> None:
        """Return freed heap to the OS, on the worker thread, at most once a second (a call
        within the second is deferred to its end, so the last large request is trimmed too).
        Call it on the event loop."""
        if self._malloc_trim is None or self._trim_pending:
            return
        wait = self._last_trim + 1.0 - time.monotonic()
        if wait > 0:
            self._trim_pending = True
            asyncio.get_running_loop().call_later(wait, self._trim_now)
            return
        self._trim_now()

    def _trim_now(self) -> None:
        self._trim_pending = False
        self._last_trim = time.monotonic()
        try:
            self.pool.submit(self._malloc_trim, 0)
        except RuntimeError:  # the pool was shut down meanwhile
            pass

    def _shadow(self, token_budget: int | None) -> Renderer:
        if not self.shadowable:
            return self.renderer
        shadow: Any = copy.copy(self.renderer)
        for name, cache in _caches(self.renderer).items():
            setattr(shadow, name, _Overlay(cache))
        fast = getattr(self.renderer, "_fast", None)  # there: `shadowable` checked it
        if fast is not None and hasattr(fast, "encode_batch_fast"):
            shadow._fast = _FastEncode(fast, token_budget)
        return shadow

    async def run(self, work: Callable[[Renderer], T], token_budget: int | None = None) -> tuple[T, Callable[[], None]]:
        """`work(renderer)` on a thread with a shadow renderer; returns its result and a
        `commit()` that merges what it cached into the shared caches (call it only for a
        prompt that was accepted, on the loop thread). With `token_budget` (the context
        window), a piece that alone reaches it raises `TooLong` (see `_FastEncode`)."""
        shadow = self._shadow(token_budget)
        result = await asyncio.get_running_loop().run_in_executor(self.pool, work, shadow)

        def commit() -> None:
            if shadow is self.renderer:
                return
            for name in _caches(self.renderer):
                overlay, shared = getattr(shadow, name), getattr(self.renderer, name)
                for k, v in dict.items(overlay):
                    shared[k] = v
                dict.clear(overlay)

        return result, commit

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
