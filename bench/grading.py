"""Grading throughput (tasks graded per minute) of each sandbox backend.

Grades the gold patch of the first `--tasks` shipped tasks (round-robin over projects) at
`--concurrency` grades at once, after building their images (not timed: a cache hit in a
training run). Each grade is the real thing: a fresh sandbox, the diff filtered and
applied, test files restored, test_patch applied, the hardened pytest run, the JUnit
report read. Prints one JSON object: per backend, tasks/min, latency percentiles, the
share of a grade spent in the test run itself, and how many graded as resolved. With
`--repeat N` every task is graded N times and `grade_s_min_p50` (the median over tasks of
each task's fastest grade) is added: on a shared machine it is the figure least disturbed
by other load, the one to compare two versions of the grader with.

    .venv/bin/python bench/grading.py [--backends local,docker] [--tasks 8] [--concurrency 2] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections import defaultdict

from legorl.tasks.image import TaskImages
from legorl.sandbox import open_backend
from legorl.tasks.loader import load_shipped
from legorl.types import Status, Task
from legorl.verify.grade import grade


def spread(tasks: list[Task], n: int) -> list[Task]:
    """Round-robin over projects so every project's test suite is represented."""
    by_repo: dict[str, list[Task]] = defaultdict(list)
    for t in sorted(tasks, key=lambda t: t.instance_id):
        by_repo[t.repo].append(t)
    out: list[Task] = []
    while len(out) < n and any(by_repo.values()):
        for repo in sorted(by_repo):
            if by_repo[repo] and len(out) < n:
                out.append(by_repo[repo].pop(0))
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def bench_backend(name: str, tasks: list[Task], concurrency: int, repeat: int = 1) -> dict:
    backend = open_backend(name)
    images = TaskImages(name)
    try:
        t0 = time.monotonic()
        keys = [await images.for_task(t) for t in tasks]
        image_s = time.monotonic() - t0
        # One untimed grade warms the backend (first container/zygote, page cache).
        await grade(tasks[0], tasks[0].patch, backend, keys[0])
        sem = asyncio.Semaphore(concurrency)
        lat: list[float] = []
        test_s: list[float] = []
        statuses: list[str] = []
        fastest: dict[str, float] = {}

        async def one(t: Task, key: str) -> None:
            async with sem:
                s = time.monotonic()
                out = await grade(t, t.patch, backend, key)
                lat.append(time.monotonic() - s)
                fastest[t.instance_id] = min(lat[-1], fastest.get(t.instance_id, float("inf")))
                test_s.append(float(out.evidence.get("test_duration_s", 0.0)))
                statuses.append(out.status.value)

        t1 = time.monotonic()
        for _ in range(repeat):
            await asyncio.gather(*(one(t, k) for t, k in zip(tasks, keys)))
        wall = time.monotonic() - t1
    finally:
        await backend.aclose()
    return {
        "tasks": len(tasks),
        "concurrency": concurrency,
        "tasks_per_min": round(60.0 * len(tasks) * repeat / wall, 2),
        "wall_s": round(wall, 2),
        "grade_s_p50": round(statistics.median(lat), 2),
        "grade_s_p95": round(pct(lat, 0.95), 2),
        "test_run_share": round(sum(test_s) / max(sum(lat), 1e-9), 3),
        "resolved": statuses.count(Status.RESOLVED.value),
        **({"repeat": repeat, "grade_s_min_p50": round(statistics.median(fastest.values()), 3)} if repeat > 1 else {}),
        "image_prepare_s": round(image_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="local,docker")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="grade every task this many times")
    args = ap.parse_args()
    tasks = spread(load_shipped(), args.tasks)
    result: dict = {"bench": "grading", "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "backends": {}}
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        result["backends"][name] = asyncio.run(bench_backend(name, tasks, args.concurrency, args.repeat))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
