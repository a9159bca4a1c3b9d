"""Harness benchmark: what one real-harness rollout costs, and how many fit on this machine.

For each harness (oracle engine, shipped tasks, local sandboxes, the production rollout
path), prints one JSON object with:
- `startup_s`: p50 / p90 over `--runs` sequential rollouts of sandbox start → the
  harness's first model request (as the proxy saw it);
- `rollout_s`: the median rollout's wall time split into `startup_s`, `model_s` (time
  inside model calls), `tool_and_harness_s` (the rest of the agent stage: tools running in
  the sandbox and the harness's own work between calls), `grade_s` (fresh-sandbox
  grading) and `other_s` (session, diff, image lookup);
- `cpu_s`: CPU seconds per rollout (median): `sandboxes` (the agent and grading sandboxes'
  cgroups, or their processes' times where the cgroup counts none: harness, tools, tests;
  polled every 0.25 s, so a lower bound), `host` (this process:
  proxy, engine, sandbox plumbing) and `warm_driver` (a `*-warm` harness's own process,
  which runs beside the sandboxes; its one-off start is before the clock, as in training);
- `peak_mem_mb`: the largest memory peak of any agent/grading sandbox cgroup (harness,
  tools and the sandbox's tmpfs disk), alone and with rollouts running concurrently;
- `delivered_fraction`: the smallest over all runs of the share of policy-sampled tokens
  (every non-side turn's completion) found at mask-1 positions of the trajectory
  (`legorl.trajectory.delivered`); must be 1.0. `--compaction` adds one run with a forced
  compaction (a proxy window inside the run; Codex: its own compaction limit; OpenHands: a
  small condenser) and reports its delivered fraction, segments and side calls;
  `--sub-agents` adds one run in which the oracle delegates the task to the harness's
  sub-agent tool (Claude Code `Agent`, OpenCode `task`, Codex `spawn_agent`), with the same
  figures: the sub-agent's turns are a segment of their own, trained with the rollout;
- `scaling`: for n = 1, 2, 4, … concurrent rollouts, wall time and rollouts per minute;
  `max_useful_concurrency` is the n after which throughput rose by less than 10 %;
- `segments` / `turns`: per rollout (median over all runs).

    .venv/bin/python bench/harness.py [--harness NAME ...] [--runs 5] [--max-n 4] [--compaction] [--sub-agents]

Timings depend on the machine's load: say how loaded it was when quoting them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: `tests.helpers`

from legorl.engine.registry import EngineConfig, make_engine  # noqa: E402
from legorl.harness.base import HostHarness  # noqa: E402
from legorl.loop.worker import RolloutWorker  # noqa: E402
from legorl.models import load_tokenizer  # noqa: E402
from legorl.trajectory import delivered  # noqa: E402
from tests.helpers.harness_util import (  # noqa: E402
    Setup,
    harness_missing,
    prompt_window_between,
    run_config,
    shipped,
)

NATIVE = ["claude-code", "opencode", "openhands", "openhands-warm", "mini-swe-agent", "mini-swe-agent-warm"]
NATIVE += ["gemini-cli", "qwen-code"]

NATIVE += ["codex", "pi"]


class CgroupPeaks:
    """Polls every sandbox cgroup's memory peak and CPU use (they vanish when a sandbox ends)."""

    ROOTS = [Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")]

    def __init__(self, period_s: float = 0.25) -> None:
        self.period_s = period_s
        self.peaks: dict[str, int] = {}
        self.cpu_us: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self) -> None:
        for root in self.ROOTS:
            if not root.is_dir():
                continue
            for d in root.glob(f"**/legorl-{os.getpid()}-*"):  # ours only: other processes run sandboxes too
                self._cpu(d)
                for name in ("memory.max_usage_in_bytes", "memory.peak", "memory.current", "memory.usage_in_bytes"):
                    try:
                        v = int((d / name).read_text().split()[0])
                    except (OSError, ValueError, IndexError):
                        continue
                    self.peaks[str(d)] = max(self.peaks.get(str(d), 0), v)
                    break

    def _cpu(self, d: Path) -> None:
        """A sandbox's CPU time so far: its cgroup's counter where there is one (v2
        `cpu.stat`, v1 `cpuacct.usage`); else (v1 without cpuacct, as here) the sum of
        utime+stime+cutime+cstime of its processes — pid 1 reaps every orphan, so what
        ended is in its children's times."""
        us = None
        try:
            if (d / "cpu.stat").exists() and "usage_usec" in (text := (d / "cpu.stat").read_text()):
                us = int(text.split("usage_usec", 1)[1].split()[0])
            elif (d / "cpuacct.usage").exists():
                us = int((d / "cpuacct.usage").read_text()) // 1000
            elif (d / "cgroup.procs").exists() and d.parent.name != "cpu":
                ticks = 0
                for pid in (d / "cgroup.procs").read_text().split():
                    try:
                        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
                us = ticks * 1_000_000 // os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return
        if us is not None:
            key = d.name  # v1 has one directory per controller: count each sandbox once
            self.cpu_us[key] = max(self.cpu_us.get(key, 0), us)

    def cpu_s(self) -> float:
        return round(sum(self.cpu_us.values()) / 1e6, 2)

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


def _row(rec: Any, t0: float, total: float) -> dict[str, Any]:
    row = {
        "wall_s": round(total, 2),
        **breakdown(rec, t0),
        "status": rec.trajectory.outcome.status.value,
        "turns": len(rec.turns),
        "segments": len(rec.trajectory.segments),
        "side_calls": len(rec.trajectory.side_turns),
        "delivered_fraction": delivered(rec.turns, rec.trajectory)["fraction"],
    }
    row["other_s"] = round(total - row["startup_s"] - row["model_s"] - row["tool_and_harness_s"] - row["grade_s"], 2)
    return row


async def run_n(setup: Setup, n: int, sequential: int = 0) -> tuple[float, list[dict[str, Any]]]:
    """n concurrent oracle rollouts (over the shipped tasks, round robin); or, with
    `sequential` > 0, that many one after another, each with its own CPU and memory figures."""
    cfg = run_config(setup)
    engine = make_engine(EngineConfig.model_validate(cfg.engine.model_dump()), load_tokenizer("tiny-qwen3"))
    tasks = shipped(3)
    out: list[dict[str, Any]] = []
    async with RolloutWorker(cfg, engine) as w:
        for t in tasks[:1]:  # build (or look up) the images outside the timed part
            await w.images.for_task(t)

        async def one(k: int) -> None:
            t0, c0, d0 = time.time(), time.process_time(), driver_cpu_s(w.harness)
            rec = await w.rollout(tasks[k % len(tasks)])
            out.append(
                {
                    **_row(rec, t0, time.time() - t0),
                    "host_cpu_s": round(time.process_time() - c0, 2),
                    "driver_cpu_s": round(driver_cpu_s(w.harness) - d0, 2),
                }
            )

        t0 = time.time()
        if sequential:
            for k in range(sequential):
                with CgroupPeaks() as peaks:
                    await one(k)
                out[-1].update(sandbox_cpu_s=peaks.cpu_s(), peak_mem_mb=peaks.max_mb())
        else:
            await asyncio.gather(*(one(k) for k in range(n)))
        wall = time.time() - t0
    await engine.close()
    return wall, out


def driver_cpu_s(harness: Any) -> float:
    """CPU seconds so far of a warm harness's own process (`*-warm`: it runs beside the
    sandboxes, so neither the sandbox cgroups nor this process count it); 0 for others."""
    proc = harness.driver.proc if isinstance(harness, HostHarness) else None
    if proc is None or proc.returncode is not None:
        return 0.0
    try:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, round(q * (len(xs) - 1)))], 2)


def compaction_setup(harness: str) -> Setup | None:
    """A setup that forces a compaction, as the suite's compaction tests do (None: it cannot
    be forced in one rollout: mini-swe-agent has no compaction; Gemini CLI compresses only
    before a new prompt, and a headless run has one, so the proxy's 400 ends it instead;
    Qwen Code compacts on its own: its ~27k-token prompt passes 70% of the 32k window)."""
    if harness in ("openhands", "openhands-warm"):
        return Setup(harness, options={"condenser_max_size": 6, "condenser_keep_first": 1}, timeout_s=900)
    if harness not in ("claude-code", "opencode", "codex", "pi"):
        return None
    rec = asyncio.run(_one(Setup(harness, timeout_s=900)))  # calibration: the prompt sizes per turn
    if harness == "codex":  # its own auto-compaction, placed between turn 0's end and turn 1's prompt
        return Setup(harness, options={"auto_compact_limit": prompt_window_between(rec, 1)}, timeout_s=900)
    return Setup(harness, max_context=prompt_window_between(rec, 3), timeout_s=900)  # the proxy's window


async def _one(setup: Setup) -> Any:
    cfg = run_config(setup)
    engine = make_engine(EngineConfig.model_validate(cfg.engine.model_dump()), load_tokenizer("tiny-qwen3"))
    try:
        async with RolloutWorker(cfg, engine) as w:
            return await w.rollout(shipped(1)[0])
    finally:
        await engine.close()


def bench_compaction(harness: str) -> dict[str, Any] | None:
    setup = compaction_setup(harness)
    if setup is None:
        return None
    rec = asyncio.run(_one(setup))
    r = _row(rec, time.time(), 0.0)
    return {k: r[k] for k in ("status", "turns", "segments", "side_calls", "delivered_fraction")}


SUB_AGENT_OPTIONS = {  # the harnesses with a sub-agent tool, and what turns it on
    "claude-code": {"tools": "Bash,Read,Edit,Write,Glob,Grep,Agent"},
    "opencode": {},
    "codex": {},
}


def bench_sub_agents(harness: str) -> dict[str, Any] | None:
    if harness not in SUB_AGENT_OPTIONS:
        return None
    setup = Setup(harness, engine_options={"delegate": True}, options=SUB_AGENT_OPTIONS[harness], timeout_s=900)
    r = _row(asyncio.run(_one(setup)), time.time(), 0.0)
    return {k: r[k] for k in ("status", "turns", "segments", "side_calls", "delivered_fraction")}


def bench_harness(harness: str, max_n: int, runs: int, compaction: bool, sub_agents: bool = False) -> dict[str, Any]:
    why = harness_missing(harness)
    if why:
        return {"harness": harness, "error": why}
    setup = Setup(harness, timeout_s=900)
    _, seq = asyncio.run(run_n(setup, 1, sequential=runs))
    scaling = [
        {
            "n": 1,
            "wall_s": round(statistics.median(r["wall_s"] for r in seq), 1),
            "rollouts_per_min": round(60.0 / statistics.median(r["wall_s"] for r in seq), 2),
            "resolved": sum(r["status"] == "resolved" for r in seq),
        }
    ]
    all_runs: list[dict[str, Any]] = list(seq)
    best, useful = scaling[0]["rollouts_per_min"], 1
    peak_concurrent = 0.0
    n = 2
    while n <= max_n:
        with CgroupPeaks() as peaks:
            wall, rows = asyncio.run(run_n(setup, n))
        peak_concurrent = max(peak_concurrent, peaks.max_mb())
        all_runs += rows
        per_min = round(60.0 * n / wall, 2)
        scaling.append(
            {
                "n": n,
                "wall_s": round(wall, 1),
                "rollouts_per_min": per_min,
                "resolved": sum(r["status"] == "resolved" for r in rows),
            }
        )
        if per_min < best * 1.10:
            break
        best, useful = per_min, n
        n *= 2
    starts = [r["startup_s"] for r in seq]
    median = sorted(seq, key=lambda r: r["wall_s"])[len(seq) // 2]
    out = {
        "harness": harness,
        "runs": len(seq),
        "startup_s": {"p50": _pct(starts, 0.5), "p90": _pct(starts, 0.9), "all": starts},
        "rollout_s": {
            k: median[k] for k in ("wall_s", "startup_s", "model_s", "tool_and_harness_s", "grade_s", "other_s")
        },
        "cpu_s": {
            "sandboxes": round(statistics.median(r["sandbox_cpu_s"] for r in seq), 2),
            "host": round(statistics.median(r["host_cpu_s"] for r in seq), 2),
            "warm_driver": round(statistics.median(r["driver_cpu_s"] for r in seq), 2),
        },
        "peak_mem_mb": {
            "alone": max(r["peak_mem_mb"] for r in seq),
            "max_concurrent": max(peak_concurrent, *(r["peak_mem_mb"] for r in seq)),
        },
        "delivered_fraction": min(r["delivered_fraction"] for r in all_runs),
        "scaling": scaling,
        "max_useful_concurrency": useful,
        "median_turns": statistics.median(r["turns"] for r in all_runs),
        "median_segments": statistics.median(r["segments"] for r in all_runs),
        "statuses": sorted({r["status"] for r in all_runs}),
    }
    if compaction:
        out["compaction"] = bench_compaction(harness)
    if sub_agents:
        out["sub_agents"] = bench_sub_agents(harness)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--harness", action="append", choices=NATIVE, help="default: all of them")
    ap.add_argument("--max-n", type=int, default=4, help="largest concurrency tried")
    ap.add_argument("--runs", type=int, default=5, help="sequential rollouts for the start-up percentiles")
    ap.add_argument("--compaction", action="store_true", help="also one run with a forced compaction")
    ap.add_argument("--sub-agents", action="store_true", help="also one run delegated to a sub-agent")
    args = ap.parse_args()
    if args.runs < 1 or args.max_n < 1:
        ap.error("--runs and --max-n must be at least 1")

    out = {
        "machine": {"cpus": os.cpu_count()},
        "engine": "oracle",
        "sandbox": "local",
        "harnesses": [
            bench_harness(h, args.max_n, args.runs, args.compaction, args.sub_agents) for h in (args.harness or NATIVE)
        ],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
