"""Sandbox and image-cache figures, printed as one JSON object.

    .venv/bin/python bench/sandbox.py [--backends local,docker] [-n 30] [--concurrency 64] [--cold-base]

- image_build_s: each layer kind built cold (a fresh recipe, so a real build) vs the cached
  lookup of the same recipe; the base's cold time is the one recorded when it was built
  (`--cold-base` rebuilds it into a scratch cache: minutes), plus the Docker conversion.
- start_to_first_exec_ms: `backend.start(spec)` until the first `exec("true")` returned, p50/p99
  over n sandboxes, image cached and backend warmed up; `<backend>_pooled` is the same with a
  pre-started SandboxPool (the sandbox is handed out warm).
  `local_cpu` is the CPU time one local start+exec+close costs (load-independent).
- concurrent: `--concurrency` sandboxes started at once, each running a small Python
  computation and closing: wall time and failures.
- grading_throughput: bench/grading.py's measurement (real grades of shipped tasks' gold
  patches, `--grade-tasks` of them at concurrency 2), per backend.
The machine's load average is reported: on a shared 2-core machine it moves every number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from legorl.sandbox import EnvSpec, ImageStore, SandboxSpec, open_backend  # noqa: E402
from legorl.sandbox.docker_images import ensure_docker_image, remove_docker_images  # noqa: E402
from legorl.sandbox.layers import ensure_base, ensure_env, ensure_task  # noqa: E402
from legorl.sandbox.pool import SandboxPool  # noqa: E402
from legorl.sandbox.testing import demo_repo  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


async def timed(coro: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = await coro
    return out, time.perf_counter() - t0


async def image_figures(store: ImageStore, backends: list[str], cold_base: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cold_base:
        with tempfile.TemporaryDirectory() as tmp:
            scratch = ImageStore(tmp)
            debs = store.root / "debs"
            if debs.is_dir():
                os.symlink(debs, Path(tmp) / "debs")  # the .debs are a download cache, not the build
            _, out["base_cold"] = await timed(ensure_base(scratch))
    base, out["base_cached"] = await timed(ensure_base(store))
    out.setdefault("base_cold", base.meta.get("build_s"))
    out["base_cold_note"] = "debootstrap, once per machine" + ("" if cold_base else " (as recorded at build)")
    marker = uuid.uuid4().hex
    spec = EnvSpec(run=(f"echo {marker} > /etc/legorl-bench",))
    env, out["env_cold"] = await timed(ensure_env(store, base, spec))
    _, out["env_cached"] = await timed(ensure_env(store, base, spec))
    with tempfile.TemporaryDirectory() as tmp:
        repo = demo_repo(Path(tmp) / "repo")
        (repo.path / "bench.txt").write_text(marker)
        task, out["task_cold"] = await timed(ensure_task(store, env, repo.path, repo.future))
        _, out["task_cached"] = await timed(ensure_task(store, env, repo.path, repo.future))
    if "docker" in backends:
        _, out["docker_cold"] = await timed(ensure_docker_image(store, task.key))  # env + task layers
        _, out["docker_cached"] = await timed(ensure_docker_image(store, task.key))
    store.prune(keys=[env.key], on_removed=remove_docker_images)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


async def start_figures(store: ImageStore, name: str, image: str, n: int) -> dict[str, Any]:
    backend = open_backend(name, store)
    spec = SandboxSpec(image=image, workdir="/")
    res: dict[str, Any] = {}
    try:
        for _ in range(2):  # warm up: zygote / API client / image conversion
            async with await backend.start(spec) as sb:
                await sb.exec("true")
        xs = []
        for _ in range(n):
            t0 = time.perf_counter()
            sb = await backend.start(spec)
            await sb.exec("true")
            xs.append((time.perf_counter() - t0) * 1000)
            await sb.close()
        res[name] = {"p50": pct(xs, 0.5), "p99": pct(xs, 0.99), "n": n}
        pool = SandboxPool(backend, size=1)
        xs = []
        for _ in range(n):
            await pool.prewarm(spec)
            t0 = time.perf_counter()
            sb = await pool.start(spec)
            await sb.exec("true")
            xs.append((time.perf_counter() - t0) * 1000)
            await sb.close()
        await pool.aclose()
        res[f"{name}_pooled"] = {"p50": pct(xs, 0.5), "p99": pct(xs, 0.99), "n": n}
    finally:
        await backend.aclose()
    return res


async def local_cpu_cost(store: ImageStore, image: str, n: int) -> dict[str, Any]:
    """CPU time (this process + zygote + sandboxes) per local start+exec+close: what the
    latency would approach on an idle machine, whatever the load here."""
    import resource

    def cpu() -> float:
        a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime

    backend = open_backend("local", store)
    spec = SandboxSpec(image=image, workdir="/")
    async with await backend.start(spec) as sb:  # zygote up
        await sb.exec("true")
    c0 = cpu()
    for _ in range(n):
        async with await backend.start(spec) as sb:
            await sb.exec("true")
    await backend.aclose()  # the zygote is reaped: its and its children's time now count
    return {"cpu_ms_per_sandbox": round((cpu() - c0) / n * 1000, 2), "n": n}


async def concurrency_figures(store: ImageStore, name: str, image: str, n: int) -> dict[str, Any]:
    backend = open_backend(name, store)
    spec = SandboxSpec(image=image, workdir="/")
    errors: list[str] = []

    async def one(i: int) -> None:
        try:
            async with await backend.start(spec) as sb:
                res = await sb.exec("python3 -c 'print(sum(range(200000)))'", timeout_s=600)
                if res.stdout != "19999900000\n":
                    errors.append(f"{i}: exit {res.exit_code} {res.stderr[-200:]}")
        except Exception as e:  # noqa: BLE001 - a bench counts failures, it does not stop at one
            errors.append(f"{i}: {type(e).__name__}: {e}")

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
    finally:
        await backend.aclose()
    return {"n": n, "wall_s": round(wall, 2), "failures": len(errors), "errors": errors[:5]}


async def grading_figures(backends: list[str], n_tasks: int) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from grading import bench_backend, spread  # bench/grading.py: one measurement, two entry points

    from legorl.tasks.loader import load_shipped

    tasks = spread(load_shipped(), n_tasks)
    return {name: await bench_backend(name, tasks, concurrency=2) for name in backends}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="local,docker")
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--cold-base", action="store_true")
    ap.add_argument("--grade-tasks", type=int, default=8, help="shipped tasks graded per backend (0: skip)")
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    store = ImageStore()
    report: dict[str, Any] = {"machine": {"cores": os.cpu_count(), "loadavg_start": os.getloadavg()}}
    report["image_build_s"] = await image_figures(store, backends, args.cold_base)
    with tempfile.TemporaryDirectory() as tmp:
        repo = demo_repo(Path(tmp) / "repo")
        task = await ensure_task(store, await ensure_base(store), repo.path, repo.base, hide_paths=list(repo.hidden))
    report["start_to_first_exec_ms"] = {}
    report["concurrent"] = {}
    for name in backends:
        report["start_to_first_exec_ms"].update(await start_figures(store, name, task.key, args.n))
        if name == "local":
            report["start_to_first_exec_ms"]["local_cpu"] = await local_cpu_cost(store, task.key, args.n)
        report["concurrent"][name] = await concurrency_figures(store, name, task.key, args.concurrency)
    if args.grade_tasks > 0:
        report["grading_throughput"] = await grading_figures(backends, args.grade_tasks)
    report["targets"] = {"local_p50_ms": 20, "docker_p50_ms": 300, "concurrent_failures": 0}
    report["machine"]["loadavg_end"] = os.getloadavg()
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
