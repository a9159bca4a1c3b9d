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

With `--runners` the native runners are measured too (`runners.<django|sympy>.<backend>`):
the tasks built from the Django and SymPy releases (tests/tasks/test_tasks_native.py), graded
under their own runners, with `parser_agreement`: the share of task tests on which the
official SWE-bench parser of the raw log and our recorder give the same verdict.

    .venv/bin/python bench/grading.py [--backends local,docker] [--tasks 8] [--concurrency 2] [--repeat 1]
                                      [--runners pytest,django,sympy]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections import defaultdict

from legorl.sandbox import open_backend
from legorl.tasks.image import TaskImages
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
        agree = [0, 0]

        async def one(t: Task, key: str) -> None:
            async with sem:
                s = time.monotonic()
                out = await grade(t, t.patch, backend, key)
                lat.append(time.monotonic() - s)
                fastest[t.instance_id] = min(lat[-1], fastest.get(t.instance_id, float("inf")))
                test_s.append(float(out.evidence.get("test_duration_s", 0.0)))
                statuses.append(out.status.value)
                pa = out.evidence.get("parser_agreement") or {}
                agree[0] += int(pa.get("agree", 0))
                agree[1] += int(pa.get("total", 0))

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
        **({"parser_agreement": round(agree[0] / agree[1], 4), "parser_tests": agree[1]} if agree[1] else {}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default="local,docker")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="grade every task this many times")
    ap.add_argument("--runners", default="pytest", help="pytest (the shipped set), django, sympy")
    args = ap.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    result: dict = {
        "bench": "grading",
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "backends": {},
    }
    if "pytest" in runners:
        tasks = spread(load_shipped(), args.tasks)
        for name in backends:
            result["backends"][name] = asyncio.run(bench_backend(name, tasks, args.concurrency, args.repeat))
    for runner in (r for r in runners if r != "pytest"):
        from legorl.tasks.generator.native import build_native_tasks
        from legorl.tasks.loader import load_tasks

        f = build_native_tasks(runner)
        native = load_tasks(f, repos_dir=f.parent / "repos")[: args.tasks]
        result.setdefault("runners", {})[runner] = {
            name: asyncio.run(bench_backend(name, native, args.concurrency, args.repeat)) for name in backends
        }
    result["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
