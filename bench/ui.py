"""UI API latency at scale: p50/p99 of the trajectory list and one trajectory at 10k trajectories.

Generates a synthetic run through the store API (`legorl.monitor.demo`: multi-turn
sessions in three dialects, segments, outcomes, trainer logprobs, metrics), serves it
with `serve_ui` in a separate process (as `legorl ui` would), and times real HTTP
requests from this one. Prints one JSON object.

    .venv/bin/python bench/ui.py [--trajectories 10000] [--dir /tmp/legorl-bench-ui] [--requests 200]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from legorl.monitor.demo import write_demo_run
from legorl.store.run_store import RunStore

TASKS, GROUP = 16, 8


def ensure_run(run_dir: Path, n: int) -> dict[str, float]:
    """Write the synthetic run unless a big enough one is already there (reruns are quick)."""
    store = RunStore(run_dir, durable=False)
    have = store.run_info()["trajectories"]
    out: dict[str, float] = {"reused_existing_run": float(have >= n)}
    if have < n:
        if have:
            raise SystemExit(f"error: {run_dir} holds a smaller run ({have}); remove it or pick another --dir")
        t0 = time.perf_counter()
        write_demo_run(store, steps=math.ceil(n / (TASKS * GROUP)), tasks=TASKS, group_size=GROUP, seed=0)
        dt = time.perf_counter() - t0
        info = store.run_info()
        out.update(
            write_seconds=round(dt, 1),
            turns_written_per_s=round(info["turns"] / dt, 1),
            sessions_written_per_s=round(info["trajectories"] / dt, 1),
        )
    info = store.run_info()
    store.close()
    out.update(
        trajectories=info["trajectories"],
        turns=info["turns"],
        store_mb=round(sum(p.stat().st_size for p in run_dir.glob("run.sqlite*")) / 2**20, 1),
    )
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(client: httpx.Client, paths: list[str]) -> dict[str, float]:
    ms = []
    for p in paths:
        t0 = time.perf_counter()
        r = client.get(p)
        ms.append((time.perf_counter() - t0) * 1000)
        if r.status_code != 200:
            raise SystemExit(f"error: GET {p} -> {r.status_code} {r.text[:200]}")
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "n": len(ms),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trajectories", type=int, default=10_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/legorl-bench-ui/run"))
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    result: dict[str, object] = {"bench": "ui_api_latency", **ensure_run(args.dir, args.trajectories)}

    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from legorl.monitor.ui.server import serve_ui; serve_ui({str(args.dir)!r}, '127.0.0.1', {port})",
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}/", timeout=30)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.get("api/run")
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("error: the UI server did not come up") from None
                time.sleep(0.1)
        rng = random.Random(1)
        store = RunStore(args.dir, readonly=True)
        sids = list(store.iter_session_ids())
        store.close()
        n = args.requests
        client.get("api/trajectories")  # warm the server's thread pool connections
        result["list_first_page"] = timed(client, ["api/trajectories?limit=50"] * n)
        result["list_deep_page"] = timed(
            client, [f"api/trajectories?limit=50&cursor={rng.randint(1, len(sids))}" for _ in range(n)]
        )
        result["list_filtered"] = timed(
            client,
            [f"api/trajectories?limit=50&status=resolved&harness=opencode&step={rng.randint(0, 70)}" for _ in range(n)],
        )
        result["list_search"] = timed(
            client,
            [
                f"api/trajectories?limit=50&q={w}"
                for w in rng.choices(["cright", "pytest", "separable", "setup.cfg"], k=n)
            ],
        )
        result["trajectory"] = timed(client, [f"api/trajectories/{s}" for s in rng.choices(sids, k=n)])
        result["metrics_all"] = timed(client, ["api/metrics"] * max(n // 10, 5))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
