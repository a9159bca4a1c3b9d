"""The evaluation manifest: what a reported `legorl eval` number was measured with, so that
it can be reproduced (and two numbers compared only when their manifests agree).

Written beside the results: `<out>.manifest.json` next to `--out <out>.json`, else
`RUN_DIR/eval_manifest.json`. It holds
- the harness: name, pinned version (its layer recipe's) and layer content keys; for the
  `command` harness the script's sha256 instead;
- the model: our engine's model directory hashed file by file (a bundled model, an HF
  directory or a checkpoint's `model/`), or the external endpoint (its weights are not ours
  to hash: the URL and the model name it was asked for);
- the tasks: source, split, file sha256 and the instance ids;
- the images: content keys of the base image and of each task's image;
- the sampling settings, the per-task sample count and the rollout limits;
- the outcome counts per failure class: `agent` (graded, not resolved: the model's),
  `infrastructure` (an infrastructure status: never the model's), `masked` (left out of
  the rates), with `resolved` and every status's count;
- pass@k and pass@1, each with a 95% interval and the method that gave it.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from legorl.loop.config import RunConfig
from legorl.loop.stats import wilson
from legorl.loop.worker import RolloutRecord
from legorl.types import INFRA_STATUSES, Status, Task

MANIFEST_VERSION = 1
BOOTSTRAP_RESAMPLES = 2000


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_tree(root: Path) -> str:
    """One hash of a directory: every file's relative path and content, in sorted order."""
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(f"{p.relative_to(root).as_posix()}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def _hash(path: Path) -> str:
    return sha256_tree(path) if path.is_dir() else sha256_file(path)


def harness_info(cfg: RunConfig) -> dict[str, Any]:
    from legorl.harness.install import HARNESS_LAYERS, RECIPES, layer_key

    name = cfg.harness.name
    out: dict[str, Any] = {"name": name, "max_turns": cfg.harness.max_turns}
    layers = HARNESS_LAYERS.get(name, ())
    if layers:
        out["version"] = RECIPES[layers[-1]].version
        out["layers"] = {n: {"version": RECIPES[n].version, "key": layer_key(n)} for n in layers}
    else:  # `command`: the agent is the script
        out["version"] = None
        if cfg.harness.command_file is not None and cfg.harness.command_file.is_file():
            out["command_file"] = str(cfg.harness.command_file)
            out["command_sha256"] = sha256_file(cfg.harness.command_file)
    return out


def model_info(cfg: RunConfig, endpoint: str | None) -> dict[str, Any]:
    if endpoint:
        return {
            "endpoint": endpoint,
            "model": cfg.harness.model_name or cfg.proxy.served_model,
            "sha256": None,
            "why_no_hash": "an external endpoint: its weights are not on this machine",
        }
    from legorl.models import ModelNotFound, resolve_model

    out: dict[str, Any] = {"engine": cfg.engine.kind, "model": cfg.engine.model}
    try:
        path = resolve_model(cfg.engine.model)
    except (ModelNotFound, OSError, ValueError) as e:
        return {**out, "sha256": None, "why_no_hash": str(e)}
    return {**out, "path": str(path), "sha256": sha256_tree(path)}


def task_file(cfg: RunConfig, split: str | None) -> Path | None:
    """The file (or directory) the split's tasks were read from."""
    from legorl.quickstart.source import SOURCE_NAME, ensure_task_file
    from legorl.sandbox.images import ImageStore
    from legorl.tasks.loader import shipped_tasks_dir

    spec = cfg.run.tasks
    if spec == "shipped":
        return shipped_tasks_dir() / f"{split}.jsonl" if split else shipped_tasks_dir()
    if spec == SOURCE_NAME:
        return ensure_task_file(ImageStore().root, cfg.calc_tasks)
    return Path(spec)


def tasks_info(cfg: RunConfig, split: str | None, tasks: list[Task]) -> dict[str, Any]:
    path = task_file(cfg, split)
    return {
        "source": cfg.run.tasks,
        "split": split,
        "file": str(path) if path else None,
        "sha256": _hash(path) if path is not None and path.exists() else None,
        "count": len(tasks),
        "instance_ids": [t.instance_id for t in tasks],
    }


def failure_classes(records: Iterable[RolloutRecord]) -> dict[str, int]:
    """Per sample: resolved; `agent` (graded and not resolved: the model's failure);
    `infrastructure` (an infrastructure status); `masked` (left out of the rates: every
    infrastructure outcome and anything else the grader masked)."""
    c: Counter[str] = Counter()
    for r in records:
        o = r.trajectory.outcome
        assert o is not None
        if o.status is Status.RESOLVED:
            c["resolved"] += 1
        elif o.status in INFRA_STATUSES:
            c["infrastructure"] += 1
        else:
            c["agent"] += 1
        c["masked"] += int(o.masked)
    return {k: c[k] for k in ("resolved", "agent", "infrastructure", "masked")}


def per_task(records: Iterable[RolloutRecord]) -> list[tuple[int, int]]:
    """(graded samples, resolved) of every task with at least one graded sample."""
    by: dict[str, list[RolloutRecord]] = {}
    for r in records:
        by.setdefault(r.trajectory.instance_id, []).append(r)
    out = []
    for rs in by.values():
        graded = [r for r in rs if not r.trajectory.outcome.masked]
        if graded:
            out.append((len(graded), sum(1 for r in graded if r.trajectory.outcome.status is Status.RESOLVED)))
    return out


def rates(records: list[RolloutRecord], k: int) -> dict[str, Any]:
    """pass@k and pass@1 with 95% intervals. With n = k samples per task pass@k is "any of
    them resolved", a proportion over tasks: Wilson's interval. pass@1 is the mean per-task
    resolved fraction: Wilson's interval when k = 1, else a percentile bootstrap over tasks
    (the samples of one task are not independent)."""
    tasks = per_task(records)
    n = len(tasks)
    if not n:
        empty = {"value": None, "ci95": None, "tasks": 0}
        return {f"pass@{k}": {**empty, "method": "no graded task"}, "pass@1": {**empty, "method": "no graded task"}}
    hit = sum(1 for _, c in tasks if c > 0)
    lo, hi = wilson(hit, n)
    out = {f"pass@{k}": {"value": hit / n, "ci95": [lo, hi], "tasks": n, "method": "wilson over tasks"}}
    fractions = [c / g for g, c in tasks]
    p1 = sum(fractions) / n
    if k == 1:
        out["pass@1"] = {"value": p1, "ci95": [lo, hi], "tasks": n, "method": "wilson over tasks"}
    else:
        rng = random.Random(0)
        means = sorted(sum(rng.choices(fractions, k=n)) / n for _ in range(BOOTSTRAP_RESAMPLES))
        ci = [means[int(0.025 * BOOTSTRAP_RESAMPLES)], means[int(0.975 * BOOTSTRAP_RESAMPLES) - 1]]
        out["pass@1"] = {
            "value": p1,
            "ci95": ci,
            "tasks": n,
            "method": f"percentile bootstrap over tasks ({BOOTSTRAP_RESAMPLES} resamples, seed 0)",
        }
    return out


def sampling(cfg: RunConfig, endpoint: str | None, k: int) -> dict[str, Any]:
    """The proxy's sampling settings (the harness's own are only recorded by it); against an
    external endpoint the requests are relayed as the harness wrote them, so none of ours apply."""
    if endpoint:
        return {"applies_to": "the harness's own requests, relayed unchanged to the endpoint", "samples_per_task": k}
    p = cfg.proxy
    return {
        "applies_to": "every policy call, whatever the harness asked (the proxy's settings)",
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "max_tokens": p.max_tokens,
        "samples_per_task": k,
    }


def _version() -> str | None:
    try:
        return metadata.version("legorl")
    except metadata.PackageNotFoundError:
        return None


def build(
    cfg: RunConfig,
    *,
    split: str | None,
    endpoint: str | None,
    tasks: list[Task],
    records: list[RolloutRecord],
    k: int,
    images: dict[str, Any],
) -> dict[str, Any]:
    return {
        "manifest_version": MANIFEST_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "legorl_version": _version(),
        "harness": harness_info(cfg),
        "model": model_info(cfg, endpoint),
        "tasks": tasks_info(cfg, split, tasks),
        "images": images,
        "sampling": sampling(cfg, endpoint, k),
        "limits": {
            "backend": cfg.sandbox.backend,
            "agent_timeout_s": cfg.sandbox.agent_timeout_s,
            "test_timeout_s": cfg.sandbox.test_timeout_s,
            "retries": cfg.sandbox.retries,
        },
        "samples": len(records),
        "failure_classes": failure_classes(records),
        "status_counts": dict(sorted(Counter(r.trajectory.outcome.status.value for r in records).items())),
        **rates(records, k),
    }


def path_for(cfg: RunConfig, out: Path | None) -> Path:
    """Beside the results file, else in the run directory."""
    return out.with_name(out.stem + ".manifest.json") if out is not None else cfg.run.dir / "eval_manifest.json"
