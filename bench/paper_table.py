"""The paper's table in miniature: `legorl train` inside Claude Code, OpenCode, OpenHands SDK,
Codex and the mixed-harness config, then the cross-harness matrix. Prints one JSON object.

Per run (examples/quickstart-<name>.toml, each a normal config of the one loop, run in a
child process so that its peak resident memory is its own): the held-out rows (start, warm
start, end, control; 95% Wilson intervals), the gain of GSPO over the warm start and the
control's, with Newcombe's 95% intervals; the minimum rollout/trainer Pearson over the steps
that trained; rollouts per minute; side calls, segments and turns per trajectory; the
parse-failure rate; the share of masked rollouts per harness; the delivered fraction (sampled
tokens that reached the trainer); wall time and peak RSS (the run's process and its children).
A mixed run has one held-out row per harness at each checkpoint and a gain per harness.

The matrix: each trained policy (the end checkpoint, before the control) evaluated through
every harness on the same held-out tasks (`legorl eval` on the harness's config, its engine
pointed at the checkpoint). The diagonal repeats the run's own end row with fresh samples.

    .venv/bin/python bench/paper_table.py [--only claude-code,opencode] [--heldout 200]
        [--out DIR] [--no-matrix] [--reuse] [--resume]

An hour or more per run on two idle cores: this is a bench run, never a test. A run longer
than a session continues with `--resume` (`legorl train --resume` on its directory); its wall
time is then the sum of its phases over the attempts, since no one process saw them all.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from legorl.loop.report import is_complete

ROOT = Path(__file__).resolve().parents[1]
RUNS = ["claude-code", "opencode", "openhands", "codex", "mixed"]
HARNESSES = ["claude-code", "opencode", "openhands", "codex"]


def child_peak_rss_gb() -> float:
    """Peak resident memory of the largest finished child so far (ru_maxrss of RUSAGE_CHILDREN, KiB)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20


def train(name: str, run_dir: Path, heldout: int | None, resume: bool = False) -> dict[str, Any]:
    """One config through `legorl train` in a fresh process (continuing the interrupted run
    in `run_dir` when `resume`); its report, metrics and cost."""
    config = ROOT / "examples" / f"quickstart-{name}.toml"
    code = (
        "import asyncio, sys, json\n"
        "from legorl.loop.config import load_run_config\n"
        "from legorl.loop.train import train\n"
        f"cfg = load_run_config(__import__('pathlib').Path({str(config)!r}))\n"
        f"cfg.run.dir = __import__('pathlib').Path({str(run_dir)!r})\n"
        + (f"cfg.heldout.tasks = {heldout}\n" if heldout else "")
        + f"s = asyncio.run(train(cfg, {'resume' if resume else 'overwrite'}=True))\n"
        "print('SUMMARY ' + json.dumps({'steps': len(s['steps'])}))\n"
    )
    before = child_peak_rss_gb()
    t0 = time.monotonic()
    proc = subprocess.run(
        ["/usr/bin/time", "-v", sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=3 * 3600
    )
    wall = time.monotonic() - t0
    peak = _time_v_peak_gb(proc.stderr) or max(before, child_peak_rss_gb())
    if proc.returncode != 0:
        return {"config": str(config), "error": proc.stderr[-3000:], "wall_s": round(wall, 1)}
    report = json.loads((run_dir / "heldout_results.json").read_text())
    peak = run_peak_gb(peak, report)
    return {
        "config": str(config.relative_to(ROOT)),
        "evaluations": report.get("evaluations"),
        "gains": report.get("gains"),
        "phases_s": report.get("phases_s"),
        **run_wall(wall, report, resume),
        "peak_rss_gb": round(peak, 2),
        **store_figures(run_dir),
    }


def reused(name: str, run_dir: Path) -> dict[str, Any]:
    """A finished run's row from its directory (wall time and peak memory are the first
    run's, printed then: not known here)."""
    report = json.loads((run_dir / "heldout_results.json").read_text())
    return {
        "config": f"examples/quickstart-{name}.toml",
        "reused": str(run_dir),
        "evaluations": report.get("evaluations"),
        "gains": report.get("gains"),
        "phases_s": report.get("phases_s"),
        **store_figures(run_dir),
    }


def run_wall(process_s: float, report: dict[str, Any], resumed: bool) -> dict[str, Any]:
    """The run's wall time: this process's, or for a resumed run the sum of its phases (the
    report adds each attempt's share of a phase), with this attempt's beside it."""
    if not resumed:
        return {"wall_s": round(process_s, 1)}
    return {
        "wall_s": round(sum(report.get("phases_s", {}).values()), 1),
        "wall_from": "phases, summed over attempts",
        "wall_s_last_attempt": round(process_s, 1),
    }


def run_peak_gb(process_peak_gb: float, report: dict[str, Any]) -> float:
    """The run's peak resident memory: the larger of the process's maximum at exit and the
    report's per-phase peaks. The loop resets the kernel's high-water mark at each phase
    (legorl/loop/memory.py), and that mark is what the maximum at exit reads, so `time -v`
    alone sees only the last phase's peak (0.81 GB for a run whose SFT peaked at 4.37)."""
    return max([process_peak_gb, *report.get("peak_rss_gb", {}).values()])


def _time_v_peak_gb(stderr: str) -> float | None:
    for line in stderr.splitlines():
        if "Maximum resident set size" in line:
            return int(line.rsplit(":", 1)[1]) / 2**20
    return None


def store_figures(run_dir: Path) -> dict[str, Any]:
    """What the run store says of the GSPO steps: mismatch, throughput, shape, masking."""
    db = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    metric: dict[str, list[tuple[int, float]]] = {}
    for step, key, value in db.execute("SELECT step, key, value FROM metrics WHERE step >= 0"):
        metric.setdefault(key, []).append((step, value))

    def values(key: str) -> list[float]:
        return [v for _, v in sorted(metric.get(key, []))]

    trained = {s for s, v in metric.get("train/sampled_tokens", []) if v > 0}
    pearson = [v for s, v in metric.get("mismatch/pearson", []) if s in trained]
    rows = db.execute(
        "SELECT harness, COUNT(*), SUM(masked), AVG(n_segments), AVG(n_turns), AVG(json_array_length(side_turns)), "
        "AVG(CASE WHEN masked = 0 THEN reward END) FROM trajectories WHERE step >= 0 GROUP BY harness"
    ).fetchall()
    mean = lambda xs: round(sum(xs) / len(xs), 4) if xs else None  # noqa: E731
    return {
        "gspo_steps": len(values("train/loss")),
        "steps_trained": len(trained),
        "pearson_min": round(min(pearson), 4) if pearson else None,
        "rollouts_per_min": mean(values("rollout/rollouts_per_min")),
        "parse_failure_rate": mean(values("rollout/parse_failure_rate")),
        "delivered_fraction_min": round(min(values("rollout/delivered_fraction_min")), 4)
        if values("rollout/delivered_fraction_min")
        else None,
        "per_harness": {
            h: {
                "rollouts": n,
                "masked_share": round((masked or 0) / n, 4),
                "segments_per_trajectory": round(seg or 0, 3),
                "turns_per_trajectory": round(turns or 0, 3),
                "side_calls_per_trajectory": round(side or 0, 3),
                "reward_mean": round(reward or 0, 4),
                # the step's per-harness key exists in a mixed run; one harness has only the run's
                "parse_failure_rate": mean(
                    values(f"rollout/parse_failure_rate/{h}") or values("rollout/parse_failure_rate")
                ),
            }
            for h, n, masked, seg, turns, side, reward in rows
        },
    }


def end_policy(run_dir: Path, into: Path, step: int | None = None) -> Path:
    """The end checkpoint (or step `step`'s, if the run kept it) as an HF model directory with
    the policy's tokenizer beside it."""
    from legorl.models import resolve_model

    steps = sorted((run_dir / "checkpoints").glob("step_*"))
    if step is not None:
        kept = [int(s.name.removeprefix("step_")) for s in steps]
        steps = [s for s in steps if int(s.name.removeprefix("step_")) == step]
        if not steps:
            raise SystemExit(f"{run_dir}: no checkpoint of step {step} (kept: {kept}; [trainer] keep_checkpoints)")
    if not steps:
        raise SystemExit(f"{run_dir}: no checkpoint")
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(steps[-1] / "model", into)
    for f in resolve_model("harness-qwen3").iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, into / f.name)
    return into


def evaluate(policy: Path, harness: str, tasks: int, out: Path) -> dict[str, Any]:
    """`legorl eval` (the loop's own evaluation) of `policy` through `harness`'s config on the
    first `tasks` held-out tasks."""
    return evaluate_config(policy, ROOT / "examples" / f"quickstart-{harness}.toml", tasks, out, f"eval-{harness}.json")


def evaluate_config(policy: Path, config: Path, tasks: int, out: Path, name: str = "eval.json") -> dict[str, Any]:
    """`evaluate` through any run config; a failure is returned as {"error": ...}, so one
    harness failing leaves the rest of a matrix."""
    import asyncio

    from legorl.loop.config import load_run_config
    from legorl.loop.evaluate import evaluate as run_eval

    cfg = load_run_config(config)
    cfg.engine.model = cfg.trainer.model = str(policy)
    cfg.run.dir = out / "eval-run"
    try:
        return asyncio.run(run_eval(cfg, limit=tasks, out=out / name))
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(RUNS), help="comma-separated runs of " + ", ".join(RUNS))
    ap.add_argument("--heldout", type=int, default=None, help="held-out tasks per evaluation (default: the config's)")
    ap.add_argument("--out", type=Path, default=ROOT / "examples" / "runs" / "paper-table")
    ap.add_argument("--no-matrix", action="store_true")
    ap.add_argument(
        "--reuse", action="store_true", help="a run whose directory under --out holds a complete report is not rerun"
    )
    ap.add_argument(
        "--resume", action="store_true", help="a run whose directory under --out holds an unfinished run continues it"
    )
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    if unknown := [n for n in names if n not in RUNS]:
        raise SystemExit(f"--only: unknown runs {unknown} (known: {', '.join(RUNS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    rows = {}
    for name in names:
        run_dir = args.out / name
        done = args.reuse and is_complete(run_dir)
        unfinished = args.resume and (run_dir / "run.sqlite").is_file() and not is_complete(run_dir)
        rows[name] = reused(name, run_dir) if done else train(name, run_dir, args.heldout, resume=unfinished)
        print(json.dumps({"run": name, **rows[name]}), file=sys.stderr, flush=True)
    matrix: dict[str, dict[str, Any]] = {}
    if not args.no_matrix:
        for name in names:
            if "error" in rows[name]:
                continue
            policy = end_policy(args.out / name, args.out / name / "policy_end")
            matrix[name] = {}
            for harness in HARNESSES:
                ev = evaluate(policy, harness, args.heldout or 200, args.out / name)
                matrix[name][harness] = {
                    k: ev.get(k) for k in ("pass@1", "tasks_scored", "samples", "status_counts", "error")
                }
    print(
        json.dumps(
            {
                "bench": "paper_table",
                "runs": rows,
                "matrix": matrix,
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
