"""Resident memory of the run's process: measured per phase and per step, and handed back.

Why: one `legorl train` holds the engine's model, the trainer's model, its gradients and
AdamW state, the engine's KV caches and the trainer's activations, all in one process. A run
that fits at step 0 and grows every step fails hours in, so the run's metrics say what each
phase and each GSPO step peaked at (`mem/peak_rss_gb`, `mem/rss_gb`; the report's
`peak_rss_gb` per phase), and the loop hands freed memory back to the OS between phases.

Peaks are the kernel's high-water mark of this process (`VmHWM` in /proc/self/status),
reset at the start of each phase (writing `5` to /proc/self/clear_refs): a sampler would
miss a short spike. Children (sandboxes, harnesses) are not counted; they have their own
limits. Where /proc is not Linux's, every figure is 0.0 and nothing fails.

Handing back: glibc keeps freed heap in its arenas (one per thread that allocated; the
trainer runs on a worker thread, the engine on its own) and returns only what sits at a
heap's top, so activations freed by a backward stay resident and the next phase's
allocations do not always land on them. `release()` runs the garbage collector, then
`malloc_trim(0)`, which returns every free page of every arena. `tame_allocator()` fixes
glibc's mmap threshold, which otherwise climbs to 32 MB after the first large free: tensors
above the threshold are mmapped and unmapped on free, so they never linger in an arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
M_MMAP_THRESHOLD = -3  # mallopt parameter numbers, from glibc's malloc.h
MMAP_THRESHOLD_BYTES = 1 << 20  # tensors of 1 MiB and more: their own mapping, unmapped on free


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None  # glibc only


_LIBC = _libc()


def _status_gb(field: str) -> float:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1e6  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def rss_gb() -> float:
    """Resident memory of this process now, in GB (10^9 bytes)."""
    return _status_gb("VmRSS")


def peak_rss_gb() -> float:
    """The most resident memory since the last `reset_peak()` (or since start), in GB."""
    return _status_gb("VmHWM")


def reset_peak() -> bool:
    """Start a new high-water mark at the current resident size; False where not supported."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def release() -> None:
    """Collect garbage, then give every free page of glibc's arenas back to the OS."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def tame_allocator(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes (no longer raised by large frees), so
    large tensors are mapped on their own and returned whole when freed. Process-wide; an
    environment's own `MALLOC_MMAP_THRESHOLD_` is left as the user set it."""
    import os

    if _LIBC is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, threshold))


def step_memory() -> dict[str, float]:
    """A GSPO step's memory metrics, then a new mark for the next: `mem/peak_rss_gb` (the
    most held since the last mark: the step's rollouts and training), `mem/rss_gb` (what
    stays once freed memory is handed back)."""
    peak = peak_rss_gb()
    release()
    now = rss_gb()
    reset_peak()
    return {"mem/peak_rss_gb": round(peak, 3), "mem/rss_gb": round(now, 3)}


class PhasePeaks:
    """Peak resident memory per named phase, in GB: `start(name)` frees what the previous
    phase left and resets the high-water mark; `stop(name)` reads it."""

    def __init__(self, release_between: Callable[[], None] = release) -> None:
        self.peaks: dict[str, float] = {}
        self._release = release_between

    def start(self) -> None:
        self._release()
        reset_peak()

    def stop(self, name: str) -> float:
        peak = round(peak_rss_gb(), 2)
        self.peaks[name] = max(self.peaks.get(name, 0.0), peak)
        return peak
