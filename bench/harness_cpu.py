"""Where a rollout's CPU goes, per native harness: the harness's own processes or the loop.

A run's wall time on two cores is mostly CPU: the engine's decoding in the loop's process,
and each rollout's harness runtime (Node, Bun, Python, a native binary) with its grading in
child processes. This evaluates one policy on the first N held-out tasks through each
harness's config (`legorl eval`'s own code, in this process), harnesses interleaved over R
rounds, and reads `getrusage` around each: the loop's own CPU (SELF) against its children's
(the harness processes and grading, once waited for). Prints one JSON object: per harness the
median and spread over rounds of CPU-seconds a rollout, turns a rollout, the share of prompt
tokens the engine copied from stored prefixes instead of computing, and wall time.

    .venv/bin/python bench/harness_cpu.py POLICY_DIR [--harnesses codex,claude-code,opencode,openhands]
        [--tasks 20] [--rounds 2]

POLICY_DIR: an HF model directory with the policy's tokenizer (`bench/paper_table.py` writes a
run's end checkpoint as one: RUN_DIR/policy_end). A bench run, never a test.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: `bench.paper_table`

from bench.paper_table import HARNESSES, evaluate  # noqa: E402


def cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def one(policy: Path, harness: str, tasks: int, out: Path) -> dict[str, Any]:
    """One evaluation through `harness`; its CPU split a rollout."""
    own0, kids0, t0 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN), time.monotonic()
    ev = evaluate(policy, harness, tasks, out)
    if ev.get("error"):
        raise SystemExit(f"{harness}: {ev['error']}")
    n = int(ev.get("samples") or tasks)
    return {
        "children_cpu_s": (cpu_s(resource.RUSAGE_CHILDREN) - kids0) / n,
        "loop_cpu_s": (cpu_s(resource.RUSAGE_SELF) - own0) / n,
        "turns": float((ev.get("turns") or {}).get("per_rollout") or 0.0),
        "prefill_reused_share": float((ev.get("prefill") or {}).get("reused_share") or 0.0),
        "wall_s": time.monotonic() - t0,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure: the median over rounds and the spread [min, max]."""
    return {
        k: {
            "median": round(statistics.median(r[k] for r in rows), 2),
            "spread": [round(min(r[k] for r in rows), 2), round(max(r[k] for r in rows), 2)],
        }
        for k in rows[0]
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("policy", type=Path)
    ap.add_argument("--harnesses", default=",".join(HARNESSES))
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/legorl-harness-cpu"))
    args = ap.parse_args()
    names = [h for h in args.harnesses.split(",") if h]
    if unknown := [h for h in names if h not in HARNESSES]:
        raise SystemExit(f"--harnesses: unknown {unknown} (known: {', '.join(HARNESSES)})")
    if not (args.policy / "config.json").is_file():
        raise SystemExit(f"{args.policy}: not an HF model directory (no config.json)")
    rows: dict[str, list[dict[str, Any]]] = {h: [] for h in names}
    for r in range(args.rounds):
        for h in names:
            rows[h].append(one(args.policy, h, args.tasks, args.work / f"{h}-{r}"))
            print(json.dumps({"round": r, "harness": h, **rows[h][-1]}), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "bench": "harness_cpu",
                "policy": str(args.policy),
                "tasks": args.tasks,
                "rounds": args.rounds,
                "per_rollout": {h: summary(v) for h, v in rows.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
