"""Torch work off the event loop, on a thread that ends with it: `await in_own_thread(fn, ...)`.

Why not `asyncio.to_thread`: its executor keeps its threads, and on Linux torch's CPU wheel runs
its parallel kernels on GNU OpenMP, which gives every thread that opens a parallel region a team
of worker threads for that thread's lifetime. Once the trainer has computed on an executor
thread, the process holds two teams: the engine's (on its generation thread) and the trainer's,
asleep. libgomp counts every team's threads; when they outnumber the cores it shortens its
spin-wait from ~300,000 iterations to 100, so between two parallel regions the engine's workers
fall asleep at once and each region waits for a futex wake. On the 2-core machine that made
serving ~35% slower for the rest of the run after the first SFT step (the engine thread did most
of the work alone: its one worker did a third of its CPU). A thread that exits frees its team
(libgomp's thread destructor), so the engine keeps the cores' spin-wait between the trainer's
calls. Measured by `bench/omp_teams.py`, recorded in docs/measured.md.

Use it for every call that runs torch kernels while an in-process engine may serve: SFT, GSPO
steps, weight copies and writes, checkpoints, and `torch.save`/`torch.load` of weights. The
event loop's own thread counts too: it lives as long as the run, so one parallel region there
(a `torch.save` of the weights copies them in parallel) keeps a team for the rest of it.
A thread costs ~0.1 ms; these calls take seconds.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def in_own_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on a new thread that ends when it returns; its result or its error.

    The caller's context variables go with it, as with `asyncio.to_thread`. Waiting is done by
    joining that thread (on the default executor, which runs no torch kernel), so when this
    returns the thread and its OpenMP team are gone. A cancelled caller leaves the work to
    finish on its own thread, as `to_thread` does.
    """
    ctx = contextvars.copy_context()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = ctx.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed to the caller, who decides
            box["error"] = exc

    thread = threading.Thread(target=work, name=f"legorl-compute-{getattr(fn, '__name__', 'call')}", daemon=True)
    thread.start()
    await asyncio.to_thread(thread.join)
    if "error" in box:
        raise box["error"]
    return box["value"]
