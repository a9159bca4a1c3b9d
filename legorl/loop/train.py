"""`legorl train`: sample tasks → groups of rollouts → store → advantages → GSPO → sync.

One step, in order (docs/architecture.md, "One loop"):
1. sample `tasks_per_step` tasks (deterministically from the seed and the step, so a
   resumed run samples what the uninterrupted run would have);
2. run a group of `group_size` rollouts per task, all groups concurrently within
   `max_concurrent_rollouts` (one rollout's grading overlaps another's agent stage);
3. write every turn, trajectory and outcome to the run store *before* training on them;
4. train one step (advantages within groups, infra errors masked), push the new weights
   to the engine, log metrics, evaluate the monitors (a critical alert may stop the run);
5. checkpoint (model, optimizer, scheduler, RNG, the next step) so `--resume` continues.

This module assembles the run (`startup.py` builds and checks its parts, `run.py` holds
them) and runs the phases (`phases.py`) in order. A run directory belongs to one run
(`run_dir.py`) and has one writer (`run_lock.py`, held for the run's life): a fresh start
into one that holds a run is refused, and `--resume` loads only this run's checkpoints and
keeps every partial attempt (a step, a held-out evaluation) as abandoned, out of the
results. The phases before GSPO (the held-out start evaluation, the warm start) end with a
checkpoint of their own, so a kill in step 0 resumes at step 0 without redoing them; the
warm start also keeps where the control begins, so any resume still runs the control.
Ctrl-C cancels the step: sandboxes and servers are closed by their context managers and
the store holds every committed record.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from rich.console import Console

from legorl.compute_thread import in_own_thread
from legorl.engine.registry import make_engine
from legorl.loop import memory, phases
from legorl.loop.budget import check_budget
from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.loop.harness_load import overloads
from legorl.loop.report import Report
from legorl.loop.run import Run
from legorl.loop.run_dir import CONTROL_START_FILE, check_checkpoint, claim, config_hash, new_run_id
from legorl.loop.run_inputs import check_weights, probe_engine
from legorl.loop.run_lock import lock_run_dir, not_a_file
from legorl.loop.startup import (
    broadcast,
    build_trainer,
    check_models,
    follow,
    load_task_split,
    record_action_format,
    resume_from_checkpoint,
    rollout_backend,
    stored_run,
)
from legorl.loop.window import FirstPrompt, check_windows
from legorl.models import load_tokenizer
from legorl.monitor.monitors import run_monitors
from legorl.monitor.sinks import Trackers, open_trackers
from legorl.store.run_store import RunStore
from legorl.store.schema import db_path
from legorl.train.checkpoint import check_weights_fit
from legorl.types import Task

T = TypeVar("T")


async def train(
    cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, console: Console | None = None
) -> dict[str, Any]:
    console = console or Console(stderr=True)
    memory.tame_allocator()  # large tensors returned to the OS when freed, not kept in glibc's arenas
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 rolls out
        return await follow(cfg, resume=resume)
    t_run = time.monotonic()
    if resume and overwrite:
        raise RunError("--resume continues the run in run.dir, --overwrite deletes it: choose one")
    not_a_file(cfg.run.dir)
    if resume and not db_path(cfg.run.dir).is_file():
        stored_run(cfg.run.dir)  # "holds no run": said before the lock creates anything there
    if cfg.engine.kind == "vllm" and not cfg.engine.served_model_dir:
        raise RunError(
            "engine.served_model_dir is required to train with vllm: the directory the server was "
            "launched on (new weights are written there and reloaded; see docs/scale-out.md)"
        )
    check_models(cfg)
    check_weights(cfg)
    tasks = load_task_split(cfg, cfg.run.split)
    heldout = load_task_split(cfg, cfg.heldout.split)[: cfg.heldout.tasks] if cfg.heldout.tasks else []
    with lock_run_dir(cfg.run.dir):  # one writer per run directory, for the run's whole life
        return await _train(cfg, tasks, heldout, resume=resume, overwrite=overwrite, console=console, t_run=t_run)


async def _train(
    cfg: RunConfig,
    tasks: list[Task],
    heldout: list[Task],
    *,
    resume: bool,
    overwrite: bool,
    console: Console,
    t_run: float,
) -> dict[str, Any]:
    """The run, once its directory is locked: claim or resume it, assemble, run the phases."""
    run_dir = cfg.run.dir
    stored = stored_run(run_dir) if resume else None
    if not resume:
        claim(cfg, overwrite=overwrite)  # nothing of another run in run.dir from here on
    tokenizer = load_tokenizer(cfg.engine.model)
    engine = make_engine(cfg.engine, tokenizer)
    try:
        await probe_engine(engine)  # a server that does not answer: one line, before any rollout
    except BaseException:
        await engine.close()
        raise
    trainer = build_trainer(cfg, engine)
    if cfg.warm_start.checkpoint is not None and not resume:  # before the start evaluation spends its time
        try:
            check_weights_fit(trainer.lm.config, cfg.warm_start.checkpoint)
        except ValueError as e:
            raise RunError(f"warm_start.checkpoint: {e} (trainer.model is {cfg.trainer.model!r})") from None
    firsts: dict[str, FirstPrompt] = {}
    window = 0
    if not resume and tasks and cfg.harness.names() != ["command"]:  # each harness's first prompt fits the window
        window = min(cfg.proxy.max_context, int(getattr(engine, "max_context", 0) or cfg.proxy.max_context))
        try:
            firsts = await check_windows(cfg, tokenizer, tasks[0], window)
        except BaseException:
            await engine.close()
            raise
    overloaded = overloads(cfg, firsts)
    for ld in overloaded:
        console.print(f"[yellow]warning:[/yellow] {ld.message()}")
    if not resume and tasks:  # the pre-flight's budget check: before the first rollout spends the hour
        est = await check_budget(cfg, trainer, engine, tokenizer, tasks[0].problem_statement)
        if est is not None:
            console.print(est.line(cfg.run.time_budget_s or 0.0))
    ranks = trainer.dist.world
    if ranks > 1 and cfg.warm_start.enabled:
        raise RunError(
            "[warm_start] runs in one process; under torchrun, warm-start first (one process), "
            "then set trainer.model to the resulting checkpoint's model/ directory"
        )
    start = 0
    if stored is not None:
        try:
            start = await resume_from_checkpoint(trainer, lambda path, st: check_checkpoint(path, st, stored, cfg))
        except BaseException:  # refused (another run's checkpoint, a changed config): nothing was written
            await engine.close()
            raise
        ident = {"run_id": stored["info"]["run_id"], "config_hash": config_hash(cfg)}
    else:
        ident = {"run_id": new_run_id(), "config_hash": config_hash(cfg)}
        trainer.data_state = dict(ident)
    run_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(run_dir, run_name=run_dir.name, config=cfg.model_dump(mode="json"))
    store.set_run_info(info={**store.run_info()["info"], **ident})
    record_action_format(store, cfg)
    if firsts:  # the pre-flight's measure of each harness's native first prompt, for the UI and the bench
        store.add_event(
            "first_prompts",
            {
                "tokens": {n: fp.tokens for n, fp in firsts.items()},
                "harness_cpu_s": {n: round(fp.cpu_s, 2) for n, fp in firsts.items()},
                "window": window,
            },
        )
    for ld in overloaded:  # the UI's alert list: the run goes on, its timeouts may be the machine's
        store.add_alert(0, "harness_start_load", "warning", ld.message(), value=ld.wait_s, threshold=ld.limit_s)
    report = Report.load(run_dir) if resume else Report(run_dir)
    if resume:  # every partial attempt, of any phase, kept as abandoned and out of the results
        kept = phases.evaluated(trainer.data_state)
        abandoned = store.abandon_attempt(start, heldout_kept=kept)
        report.keep_only(kept)
        console.print(
            f"resumed at step {start}"
            + (f" ({abandoned} rollouts of the interrupted attempt kept as abandoned)" if abandoned else "")
        )
    run = Run(cfg, trainer, tasks, heldout, store, report, tokenizer, console, ranks=ranks)
    ui = None
    if cfg.run.ui:
        from legorl.monitor.ui.server import UIServerThread

        ui = UIServerThread(run_dir, port=cfg.run.ui_port)
        ui.start()
        console.print(f"live UI: {ui.url}")
    summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": []}
    trackers = open_trackers(cfg.monitor.sinks, run_dir, run_dir.name, cfg.model_dump(mode="json"))
    if trackers is not None:
        store.attach(trackers)  # every metric and alert the store records, from here on
    try:
        async with rollout_backend(cfg, engine) as worker:
            run.worker = worker
            await _phases(run, start, summary, trackers)
        report.complete = True
    finally:
        if ranks > 1:
            broadcast(None)  # followers leave their loop
        if ui is not None:
            ui.stop()
        await engine.close()
        _finish(run, trackers, time.monotonic() - t_run)
    if report.rows:
        summary["heldout"] = report.as_dict()
    return summary


async def _phases(run: Run, start: int, summary: dict[str, Any], trackers: Trackers | None) -> None:
    """The phases in order; `summary` collects each GSPO step's metrics and a stop's reasons."""
    cfg, trainer, store, report, console = run.cfg, run.trainer, run.store, run.report, run.console
    placed = getattr(run.worker, "placement", None)  # Ray: which node runs what
    if placed is not None:
        store.add_event("ray_placement", placed)
    at = set(cfg.heldout.at) if run.heldout else set()

    async def timed(name: str, work: Awaitable[T]) -> T:
        """A phase, timed; its peak resident memory also goes to the metrics (`mem/NAME/peak_rss_gb`),
        on the row of the last GSPO step so far (0 before any): never a row of its own, since
        the monitors read one row a step."""
        out = await report.timed(name, work)
        store.log_metrics(max(trainer.step_count - 1, 0), {f"mem/{name}/peak_rss_gb": report.peak_rss_gb[name]})
        return out

    control = False  # whether the control runs: its start is on disk (phases.keep_control_start)
    if start == 0 and not trainer.data_state.get("pre_gspo_done"):  # a resumed run has them in its checkpoint
        if "start" in at:
            await timed("eval_start", phases.evaluate(run, "start"))
        if cfg.warm_start.enabled:
            demos = await timed("warm_start", phases.warm_start(run))
            if demos is not None and run.heldout:  # a resume still runs the control from it
                await in_own_thread(phases.keep_control_start, run, demos)
                control = True
            if cfg.warm_start.episodes and cfg.warm_start.gspo_moments == "fresh":
                trainer.fresh_moments()  # after the control's start kept the SFT's own
            if "warm_start" in at:
                await timed("eval_warm_start", phases.evaluate(run, "warm_start"))
        trainer.data_state = {
            **trainer.data_state,
            "pre_gspo_done": True,
            "next_step": 0,
            "evaluated": list(phases.PRE_GSPO_EVALS),
        }
        ran = "start" in at or cfg.warm_start.enabled
        if ran and run.ranks == 1:  # a kill in step 0 resumes at step 0 without redoing these (under
            # torchrun a checkpoint is a collective the followers join only in train_step)
            after = "the warm start" if cfg.warm_start.enabled else "the held-out start evaluation"
            await in_own_thread(phases.save_or_fail, trainer, after, None)
    elif run.heldout and cfg.warm_start.enabled and cfg.warm_start.control_steps:  # resumed after the warm start
        control = phases.control_start_kept(run)
        if not control:
            console.print(
                f"[yellow]no {CONTROL_START_FILE} in {cfg.run.dir} (written by an older legorl): "
                "the control is not run[/yellow]"
            )
    await in_own_thread(phases.hold_kl_reference, run)  # after the warm start, before the first GSPO update
    t_gspo = time.monotonic()
    memory.release()  # each step's `mem/peak_rss_gb` is its own (memory.step_memory)
    memory.reset_peak()
    step = start
    steps = phases.gspo_steps(run, start)
    async with contextlib.aclosing(steps):  # a stop cancels the later steps' rollouts now
        async for metrics in steps:
            verdict = run_monitors(store, cfg.monitor, step)
            if trackers is not None:  # the step's record says what the trackers had to drop
                store.log_metrics(step, trackers.take_dropped())
            console.print(
                f"step {step}: reward {metrics.get('reward/mean', 0):.3f} resolved "
                f"{metrics.get('resolved_rate', 0):.2f} "
                f"loss {metrics.get('train/loss', 0):.4g} rollouts {metrics['rollout/count']:.0f} in "
                f"{metrics['time/rollout_s']:.1f}s, train+sync {metrics['time/train_sync_s']:.1f}s, alerts "
                f"{len(verdict.alerts)}"
            )
            summary["steps"].append({k: metrics[k] for k in sorted(metrics)})
            if verdict.should_stop:
                console.print(f"[red]stopping: {'; '.join(verdict.stop_reasons)}[/red]")
                summary["stopped"] = verdict.stop_reasons
                break
            step += 1
    report.phase("gspo", time.monotonic() - t_gspo)
    report.peak("gspo", max([s.get("mem/peak_rss_gb", 0.0) for s in summary["steps"]] + [memory.peak_rss_gb()]))
    store.log_metrics(max(trainer.step_count - 1, 0), {"mem/gspo/peak_rss_gb": report.peak_rss_gb["gspo"]})
    if placed is not None:  # and again after the steps: actors lost on the way, rollouts retried
        store.add_event("ray_placement", run.rollouts.placement)  # type: ignore[attr-defined]
    done = phases.evaluated(trainer.data_state)
    if "end" in at and "end" not in done:  # a resume during the control has it already
        await timed("eval_end", phases.evaluate(run, "end"))
    if run.heldout and control:
        trainer.data_state = {**trainer.data_state, "evaluated": sorted(done | {"end"})}
        trainer.save_checkpoint()  # the trained policy is kept; the control then starts from the warm start
        await timed("control", phases.control(run))
        await timed("eval_control", phases.evaluate(run, "control"))


def _finish(run: Run, trackers: Trackers | None, wall_s: float) -> None:
    """The report's table, the trackers flushed, the store closed (also after an error)."""
    store, report, console = run.store, run.report, run.console
    if report.rows:
        report.finish(wall_s, budget_s=run.cfg.run.time_budget_s)
        store.add_event("heldout", report.as_dict())
        if trackers is not None:
            trackers.summary("heldout", report.as_dict())
        console.print(report.text())
    if trackers is not None:
        t_close = time.monotonic()
        late = {k: v for k, v in trackers.close().items() if v}
        if late:  # dropped after the last step's record: the run's events say so
            store.add_event("tracker_dropped", late)
        console.print(f"trackers {', '.join(trackers.names)}: flushed in {time.monotonic() - t_close:.1f}s")
    store.close()
