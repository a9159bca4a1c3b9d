"""The driver side of the warm-harness protocol (the host side: `legorl/harness/warm.py`).

Standard library only: it runs in a harness layer's own interpreter (mini-swe-agent's venv,
the OpenHands SDK's Python 3.12), which cannot import `legorl`. A driver imports this module
first, so that the protocol owns the real stdout before the harness is imported: anything
the harness or LiteLLM prints goes to stderr (the driver's log) instead of corrupting the
JSON lines. Then it imports its harness, says `ready` and `serve`s: each "run" in a thread
of a pool, each "result" handed to the thread that asked for it.

Where this runs (the rule for every `in_driver/` folder of the project): everything under
`legorl/harness/in_driver/` runs in a harness layer's own interpreter, outside any sandbox,
as a long-lived warm driver. The host starts a driver by path (`warm.WarmDriver`) and never
imports these files; they never import `legorl`. A driver puts its own folder and
`../warm_driver_lib` on sys.path. Programs that run inside a sandbox live in `in_sandbox/`.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PROTOCOL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

_out_lock = threading.Lock()
_pending: dict[int, queue.Queue] = {}
_counter = itertools.count(1)


def write(msg: dict[str, Any]) -> None:
    line = json.dumps(msg) + "\n"
    with _out_lock:
        PROTOCOL.write(line)
        PROTOCOL.flush()


def request(msg: dict[str, Any]) -> queue.Queue:
    """Send a request to the host; its reply arrives on the returned queue."""
    n = next(_counter)
    box: queue.Queue = queue.Queue(maxsize=1)
    _pending[n] = box
    write({**msg, "n": n})
    return box


def call(msg: dict[str, Any]) -> dict[str, Any]:
    """Send a request to the host and wait for its reply."""
    return request(msg).get()


def serve(
    run_one: Callable[[dict[str, Any]], None],
    *,
    ready: dict[str, Any] | None = None,
    on_cancel: Callable[[str], None] | None = None,
    threads_env: str = "LEGORL_DRIVER_THREADS",
) -> None:
    """Say ready, then read the host's messages until it closes stdin; then unblock every
    request still waiting and leave at once (the threads may be inside the harness)."""
    pool = ThreadPoolExecutor(max_workers=int(os.environ.get(threads_env, "256")))
    write({**(ready or {}), "op": "ready"})
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg["op"] == "run":
            pool.submit(run_one, msg)
        elif msg["op"] == "cancel":
            if on_cancel is not None:
                on_cancel(msg["id"])
        elif msg["op"] == "result":
            box = _pending.pop(int(msg["n"]), None)
            if box is not None:
                box.put(msg)
    for box in list(_pending.values()):
        box.put({"error": "the LEGO-RL host closed the driver"})
    pool.shutdown(wait=False, cancel_futures=True)
    os._exit(0)
