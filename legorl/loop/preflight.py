"""`legorl doctor`: pre-flight checks of the whole chain a run config needs, in its order.

Each component registers its own checks with `@check` next to its code (`monitor/doctor.py`);
this module imports those modules when the doctor runs (nothing heavy at `import legorl`),
registers the loop's own two (free disk and memory, time budget) and runs them in `ORDER`.

Each check fails for its real reason with a hint that fixes it; later checks that need a
failed one are skipped (a stopped engine is one red line, not five). The checks, in order:

- engine answers: a short generation by token ids, within a timeout;
- engine logprobs mode (`vllm` / `sglang`): one sampled token's logprob, recomputed by the
  trainer's model, is the processed (temperature-scaled) one, not raw log-softmax;
- chat template round trip: our incremental renderer equals the model's own chat
  template, and render → generate → parse → render-next-turn keeps the recorded ids an
  exact prefix (what makes trajectories one segment);
- sandbox starts (the configured backend, from the base image);
- sandbox isolation: no route to a listener on the host's loopback, no host files;
- harness installed (and, for `command`, its script exists);
- harness reaches its proxy session: from inside a sandbox, through the session socket;
- grading self-test on a task: gold patch → resolved, empty patch → not resolved;
- run store writable (SQLite WAL + FTS5); free disk and memory;
- time budget (with `[run] time_budget_s`): the least work the config asks for, at the
  trainer's and engine's measured speed, fits the budget (legorl/loop/budget.py);
- the silent failures (legorl/ops/): tool calls round-trip from the model's template through
  the proxy to each harness's dialect; routing replay wired (MoE: one dry step, Pearson ≥
  0.99); the learning rate is non-zero on every planned step; each harness's first prompt
  fits the window.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
from pathlib import Path
from typing import Any

from legorl.loop.config import RunConfig
from legorl.monitor.doctor import REGISTRY, Check, CheckFailed, check

CHECK_MODULES = (  # the modules that register checks with `@check`, imported when the doctor runs
    "legorl.engine.checks",
    "legorl.proxy.checks",
    "legorl.ops.toolcall_check",
    "legorl.ops.replay_check",
    "legorl.ops.plan_checks",
    "legorl.sandbox.checks",
    "legorl.harness.checks",
    "legorl.verify.checks",
)
ORDER = (  # the chain's order: a check after those it needs; one registered elsewhere runs last
    "engine answers",
    "chat template round trip",
    "tool calls round-trip",
    "engine logprobs mode",
    "routing replay wired",
    "learning rate non-zero",
    "sandbox starts",
    "sandbox isolation",
    "sandbox reaches its proxy session",
    "harness installed",
    "first prompt fits the window",
    "grading self-test",
    "run store",
    "free disk and memory",
    "time budget",
)


@check("free disk and memory", timeout=10, args=lambda cfg: (cfg.run.dir,))
def resources_check(run_dir: Path, min_disk_gb: float = 5.0, min_mem_gb: float = 2.0) -> str:
    probe = run_dir if run_dir.exists() else Path(os.path.abspath(run_dir)).parent
    while not probe.exists():
        probe = probe.parent
    disk = shutil.disk_usage(probe).free / 2**30
    mem = 0.0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                mem = int(line.split()[1]) / 2**20
    if disk < min_disk_gb:
        raise CheckFailed(f"{disk:.1f} GiB free under {probe}", fix=f"free disk space (≥ {min_disk_gb} GiB)")
    if mem < min_mem_gb:
        raise CheckFailed(f"{mem:.1f} GiB memory available", fix=f"free memory (≥ {min_mem_gb} GiB)")
    return f"{disk:.0f} GiB disk free, {mem:.1f} GiB memory available"


@check("time budget", needs=("engine answers",), timeout=600, when=lambda cfg: bool(cfg.run.time_budget_s))
def budget_check(cfg: RunConfig) -> str:
    """`[run] time_budget_s` against the measured speed (legorl/loop/budget.py); `legorl
    train` runs the same estimate at start-up, before its first rollout."""
    from legorl.engine.registry import make_engine
    from legorl.loop.budget import check_budget
    from legorl.loop.errors import RunError
    from legorl.loop.startup import load_task_split
    from legorl.models import load_tokenizer
    from legorl.train.trainer import Trainer

    tok = load_tokenizer(cfg.engine.model)
    tasks = load_task_split(cfg, cfg.run.split)
    trainer = Trainer(cfg.trainer)

    async def go() -> Any:
        engine = make_engine(cfg.engine, tok)
        try:
            return await check_budget(cfg, trainer, engine, tok, tasks[0].problem_statement)
        finally:
            await engine.close()

    try:
        est = asyncio.run(go())
    except RunError as e:
        raise CheckFailed(str(e), "shrink the run or raise run.time_budget_s") from None
    return est.line(cfg.run.time_budget_s or 0.0)


def preflight_checks(cfg: RunConfig) -> list[Check]:
    """The checks `cfg` asks for, in `ORDER`, then any other registered check."""
    for module in CHECK_MODULES:
        importlib.import_module(module)
    names = [n for n in ORDER if n in REGISTRY] + [n for n in REGISTRY if n not in ORDER]
    return [c for n in names if (c := REGISTRY[n].for_config(cfg)) is not None]
