"""Harness benchmark: what one real-harness rollout costs, and how many fit on this machine.

For each harness (oracle engine, shipped task, local sandboxes, the production rollout
path), prints one JSON object with:
- `rollout_s`: wall time of one rollout split into `startup_s` (sandbox up and harness
  launched until its first model call), `model_s` (time inside model calls, as the proxy
  saw them), `tool_and_harness_s` (the rest of the agent stage: tools running in the
  sandbox and the harness's own work between calls), `grade_s` (fresh-sandbox grading)
  and `other_s` (session, diff, image lookup);
- `peak_mem_mb`: the largest memory peak of any agent/grading sandbox cgroup (harness,
  tools and the sandbox's tmpfs disk) while rollouts ran alone and concurrently;
- `scaling`: for n = 1, 2, 4, … concurrent rollouts, wall time and rollouts per minute;
  `max_useful_concurrency` is the n after which throughput rose by less than 10 %;
- `segments` / `turns`: per rollout (median over all runs).

    .venv/bin/python bench/harness.py [--harness NAME ...] [--max-n 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness_util import Setup, harness_missing, run_config, shipped  # noqa: E402

from legorl.engine.registry import EngineConfig, make_engine  # noqa: E402
from legorl.loop.worker import RolloutWorker  # noqa: E402
from legorl.models import load_tokenizer  # noqa: E402

NATIVE = ["claude-code", "opencode", "openhands", "mini-swe-agent", "mini-swe-agent-warm"]
NATIVE += ["gemini-cli", "qwen-code"]

NATIVE += ["codex", "pi"]


class CgroupPeaks:
    """Polls every sandbox cgroup's memory peak (they vanish when a sandbox ends)."""

    ROOTS = [Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")]

    def __init__(self, period_s: float = 0.25) -> None:
        self.period_s = period_s
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self) -> None:
        for root in self.ROOTS:
            if not root.is_dir():
                continue
            for d in root.glob("**/legorl-*"):
                for name in ("memory.max_usage_in_bytes", "memory.peak", "memory.current", "memory.usage_in_bytes"):
                    try:
                        v = int((d / name).read_text().split()[0])
                    except (OSError, ValueError, IndexError):
                        continue
                    self.peaks[str(d)] = max(self.peaks.get(str(d), 0), v)
                    break

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except OSError:
                pass
            self._stop.wait(self.period_s)

    def __enter__(self) -> CgroupPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def max_mb(self) -> float:
        return round(max(self.peaks.values(), default=0) / 2**20, 1)


def breakdown(rec: Any, t_agent_start: float) -> dict[str, float]:
    turns = sorted(rec.turns, key=lambda t: t.t_start)
    timings = rec.result.timings
    agent = timings.get("agent_s", 0.0)
    model = sum(t.t_end - t.t_start for t in turns)
    startup = (turns[0].t_start - t_agent_start) if turns else agent
    return {
        "startup_s": round(startup, 2),
        "model_s": round(model, 2),
        "tool_and_harness_s": round(max(agent - startup - model, 0.0), 2),
        "grade_s": round(timings.get("grade_s", 0.0), 2),
    }


async def run_n(harness: str, n: int) -> tuple[float, list[dict[str, Any]]]:
    """n concurrent oracle rollouts (over the shipped tasks, round robin)."""
    setup = Setup(harness, timeout_s=900)
    cfg = run_config(setup)
    engine = make_engine(EngineConfig.model_validate(cfg.engine.model_dump()), load_tokenizer("tiny-qwen3"))
    tasks = shipped(3)
    out: list[dict[str, Any]] = []
    async with RolloutWorker(cfg, engine) as w:
        for t in tasks[:1]:  # build (or look up) the images outside the timed part
            await w.images.for_task(t)

        async def one(k: int) -> None:
            t0 = time.time()
            rec = await w.rollout(tasks[k % len(tasks)])
            total = time.time() - t0
            row = {"wall_s": round(total, 2), **breakdown(rec, t0), "status": rec.trajectory.outcome.status.value,
                   "turns": len(rec.turns), "segments": len(rec.trajectory.segments)}
            row["other_s"] = round(total - row["startup_s"] - row["model_s"] - row["tool_and_harness_s"]
                                   - row["grade_s"], 2)
            out.append(row)

        t0 = time.time()
        await asyncio.gather(*(one(k) for k in range(n)))
        wall = time.time() - t0
    await engine.close()
    return wall, out


def bench_harness(harness: str, max_n: int) -> dict[str, Any]:
    why = harness_missing(harness)
    if why:
        return {"harness": harness, "error": why}
    scaling = []
    runs: list[dict[str, Any]] = []
    best = 0.0
    useful = 1
    peaks_by_n: dict[int, float] = {}
    n = 1
    while n <= max_n:
        with CgroupPeaks() as peaks:
            wall, rows = asyncio.run(run_n(harness, n))
        peaks_by_n[n] = peaks.max_mb()
        runs += rows
        per_min = round(60.0 * n / wall, 2)
        scaling.append({"n": n, "wall_s": round(wall, 1), "rollouts_per_min": per_min,
                        "resolved": sum(r["status"] == "resolved" for r in rows)})
        if per_min < best * 1.10:
            break
        best, useful = per_min, n
        n *= 2
    single = [r for r in runs][:1][0]
    return {
        "harness": harness,
        "rollout_s": {k: single[k] for k in ("wall_s", "startup_s", "model_s", "tool_and_harness_s", "grade_s",
                                             "other_s")},
        "rollout_s_median_all": round(statistics.median(r["wall_s"] for r in runs), 2),
        "peak_mem_mb": {"alone": peaks_by_n.get(1), "max_concurrent": max(peaks_by_n.values())},
        "scaling": scaling,
        "max_useful_concurrency": useful,
        "median_turns": statistics.median(r["turns"] for r in runs),
        "median_segments": statistics.median(r["segments"] for r in runs),
        "statuses": sorted({r["status"] for r in runs}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--harness", action="append", choices=NATIVE, help="default: all of them")
    ap.add_argument("--max-n", type=int, default=4, help="largest concurrency tried")
    args = ap.parse_args()
    import os

    out = {"machine": {"cpus": os.cpu_count()}, "engine": "oracle", "sandbox": "local",
           "harnesses": [bench_harness(h, args.max_n) for h in (args.harness or NATIVE)]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
