"""`legorl eval`: pass@1 / pass@k of a harness over a task split.

Against our engine (the config's `[engine]`, e.g. a checkpoint) or any external OpenAI- or
Anthropic-compatible endpoint (`--endpoint`), so a baseline model is measured with the
same harness, sandboxes and grading. pass@k uses the unbiased estimator of Chen et al.
(2021) with n = k samples per task, i.e. "any of the k resolved"; pass@1 is the mean
resolved rate over all samples. Infrastructure errors are reported, and left out of the
rates (a crashed sandbox says nothing about the model). Every evaluation writes its
manifest beside its results (legorl/loop/manifest.py): what the number was measured with.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from math import comb
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from legorl.engine.base import prefill_share
from legorl.engine.registry import make_engine
from legorl.harness.actions import ActionFormat, format_of
from legorl.loop.config import RunConfig
from legorl.loop.manifest import build as build_manifest
from legorl.loop.manifest import path_for as manifest_path
from legorl.loop.record import CONTEXT_FLAG, SILENT_EXIT_FLAG
from legorl.loop.startup import load_task_split
from legorl.loop.worker import RolloutRecord, RolloutWorker
from legorl.models import load_tokenizer
from legorl.trajectory import delivered
from legorl.types import FinishReason, Status, Task


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for n samples of which c are correct."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(records: list[RolloutRecord], k: int) -> dict[str, Any]:
    by_task: dict[str, list[RolloutRecord]] = {}
    for r in records:
        by_task.setdefault(r.trajectory.instance_id, []).append(r)
    p1, pk = [], []
    for rs in by_task.values():
        valid = [r for r in rs if not r.trajectory.outcome.masked]
        if not valid:
            continue
        c = sum(1 for r in valid if r.trajectory.outcome.status is Status.RESOLVED)
        p1.append(c / len(valid))
        pk.append(pass_at_k(len(valid), c, min(k, len(valid))))
    statuses = Counter(r.trajectory.outcome.status.value for r in records)
    return {
        "tasks": len(by_task),
        "samples": len(records),
        "k": k,
        "pass@1": sum(p1) / len(p1) if p1 else 0.0,
        f"pass@{k}": sum(pk) / len(pk) if pk else 0.0,
        "tasks_scored": len(p1),
        "status_counts": dict(sorted(statuses.items())),
    }


def turn_summary(records: list[RolloutRecord], fmt: ActionFormat) -> dict[str, Any]:
    """How the policy's turns went, judged by the harness's own action format
    (`legorl.harness.actions`): the share that held an action the harness could take (a
    tool call, or the one command block mini-swe-agent reads), the share it could parse at
    all (an action or a final answer), prompt and completion tokens per turn, and seconds per
    turn (request to last token, as the proxy saw it). Side calls (titles, summaries) are
    the harness's, not the policy's: left out. These are what collapse first when a real
    model trains, and what a real model's evaluation has to show beside its pass rate."""
    turns = [t for r in records for t in r.turns if not t.side_call]
    n = len(turns)
    flags = Counter(f for r in records for f in r.trajectory.outcome.flags)

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    return {
        "action_format": fmt.label,
        "count": n,
        "per_rollout": round(n / len(records), 3) if records else 0.0,
        "action_share": mean([float(fmt.acts(t)) for t in turns]),
        "parse_share": mean([float(fmt.parses(t)) for t in turns]),
        "prompt_tokens": mean([float(len(t.prompt_ids)) for t in turns]),
        "completion_tokens": mean([float(len(t.completion_ids)) for t in turns]),
        "seconds": mean([t.t_end - t.t_start for t in turns if t.t_end >= t.t_start > 0]),
        "finish_length_share": mean([float(t.finish_reason is FinishReason.LENGTH) for t in turns]),
        # the smallest share of any rollout's sampled tokens found at its trained positions: 1.0
        "delivered_fraction": min((float(delivered(r.turns, r.trajectory)["fraction"]) for r in records), default=None),
        CONTEXT_FLAG: flags.get(CONTEXT_FLAG, 0),
        SILENT_EXIT_FLAG: flags.get(SILENT_EXIT_FLAG, 0),
    }


async def image_keys(w: RolloutWorker, tasks: list[Task], records: list[RolloutRecord]) -> dict[str, Any]:
    """Content keys of the images the evaluation ran in (the worker has them cached); a
    task whose image could not be built has none."""
    unbuilt = {r.trajectory.instance_id for r in records if "task_image" in r.trajectory.outcome.flags}
    per: dict[str, str | None] = {}
    for t in tasks:
        per[t.instance_id] = None if t.instance_id in unbuilt else await w.images.for_task(t)
    return {"base": (await w.images.base()).key, "tasks": per}


def print_summary(summary: dict[str, Any], console: Console) -> None:
    t = Table(title=f"eval: {summary['tasks']} tasks × {summary['k']} samples")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("pass@1", f"{summary['pass@1']:.3f}")
    key = f"pass@{summary['k']}"
    t.add_row(key, f"{summary[key]:.3f}")
    for status, n in summary["status_counts"].items():
        t.add_row(f"status/{status}", str(n))
    turns = summary.get("turns", {})
    for key in ("count", "action_share", "parse_share", "prompt_tokens", "seconds", CONTEXT_FLAG, SILENT_EXIT_FLAG):
        if turns.get(key) is not None:
            t.add_row(f"turns/{key}", f"{turns[key]:g}")
    if prefill := summary.get("prefill"):
        t.add_row("prefill/reused_share", f"{prefill['reused_share']:g}")
    console.print(t)


async def evaluate(
    cfg: RunConfig,
    *,
    split: str | None = None,
    endpoint: str | None = None,
    api_key: str | None = None,
    k: int | None = None,
    limit: int | None = None,
    out: Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    console = console or Console(stderr=True)
    k = k or cfg.eval.k
    endpoint = endpoint or cfg.eval.endpoint
    tasks = load_task_split(cfg, split or cfg.run.eval_split)
    limit = limit or cfg.eval.limit
    tasks = tasks[:limit] if limit else tasks
    engine = None if endpoint else make_engine(cfg.engine, load_tokenizer(cfg.engine.model))
    sem = asyncio.Semaphore(cfg.run.max_concurrent_rollouts)
    try:
        async with RolloutWorker(
            cfg, engine, upstream=endpoint, upstream_api_key=api_key or cfg.eval.endpoint_api_key
        ) as w:
            fmt = format_of(w.harness)
            groups = await asyncio.gather(*(w.group(t, k, step=0, limit=sem) for t in tasks))
            images = await image_keys(w, tasks, [r for g in groups for r in g])
    finally:
        if engine is not None:
            await engine.close()
    records = [r for g in groups for r in g]
    summary = summarize(records, k)
    summary["turns"] = turn_summary(records, fmt)
    summary["endpoint"] = endpoint or f"{cfg.engine.kind}:{cfg.engine.model}"
    summary["harness"] = cfg.harness.name
    if (prefill := prefill_share(engine)) is not None:
        summary["prefill"] = prefill
    summary["per_task"] = (
        {r.trajectory.instance_id: r.trajectory.outcome.status.value for r in records} if k == 1 else {}
    )
    print_summary(summary, console)
    manifest = build_manifest(
        cfg, split=split or cfg.run.eval_split, endpoint=endpoint, tasks=tasks, records=records, k=k, images=images
    )
    where = manifest_path(cfg, out)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(json.dumps(manifest, indent=1))
    summary["manifest"] = str(where)
    if out is not None:
        from legorl.loop.official_report import run_report

        first: dict[str, Any] = {}
        for r in records:  # the official harness grades one prediction per instance: the first sample
            first.setdefault(r.trajectory.instance_id, r.trajectory.outcome)
        out.parent.mkdir(parents=True, exist_ok=True)
        official = out.with_name(out.stem + ".swebench.json")  # the official harness's results shape
        official.write_text(json.dumps(run_report(tasks, first), indent=1))
        summary["swebench_report"] = str(official)
        out.write_text(json.dumps(summary, indent=1))
    return summary
