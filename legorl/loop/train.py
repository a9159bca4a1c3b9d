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
A run directory belongs to one run (`run_dir.py`): a fresh start into one that holds a run
is refused, and `--resume` loads only this run's checkpoints. The phases before GSPO (the
held-out start evaluation, the warm start) end with a checkpoint of their own, so a kill
in step 0 resumes at step 0 without redoing them.
Ctrl-C cancels the step: sandboxes and servers are closed by their context managers and
the store holds every committed record.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import random
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rich.console import Console

from legorl.engine.base import Engine, EngineError, ServesModelDir, WeightsFromDisk, WeightsInPlace
from legorl.engine.registry import make_engine
from legorl.harness.actions import format_of
from legorl.harness.install import HarnessNotInstalled
from legorl.harness.registry import make_harness
from legorl.loop.budget import check_budget
from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.loop.heldout import evaluate_heldout
from legorl.loop.metrics import rollout_metrics
from legorl.loop.report import Report
from legorl.loop.run_dir import check_checkpoint, claim, config_hash, new_run_id
from legorl.loop.warm_start import WARM_START_STEP, demo_tasks, imitated, record_demonstrations
from legorl.loop.worker import OnRecord, RolloutBackend, RolloutRecord, RolloutWorker
from legorl.models import ModelNotFound, check_model, load_tokenizer
from legorl.monitor.monitors import run_monitors
from legorl.monitor.sinks import open_trackers
from legorl.monitor.store import RunStore
from legorl.quickstart.source import SOURCE_NAME, ensure_task_file
from legorl.sandbox.images import ImageStore
from legorl.tasks.loader import TaskFileError, load_shipped, load_tasks
from legorl.train.checkpoint import check_weights_fit, load_weights
from legorl.train.sft import sft
from legorl.train.trainer import Trainer
from legorl.types import Status, Task


def load_task_split(cfg: RunConfig, split: str | None) -> list[Task]:
    """The tasks of `split` from `run.tasks`: a task file, `shipped`, or a generated source."""
    spec = cfg.run.tasks
    if spec == "shipped":
        tasks = load_shipped(split)
    elif spec == SOURCE_NAME:
        tasks = load_tasks(ensure_task_file(ImageStore().root, cfg.calc_tasks), split)
    else:
        tasks = load_tasks(spec, split)
    if not tasks:
        raise TaskFileError(spec, [f"{spec}: no tasks of split {split!r} (set run.split / run.eval_split)"])
    return tasks


def sample_tasks(tasks: list[Task], n: int, seed: int, step: int) -> list[Task]:
    rng = random.Random(seed * 1_000_003 + step)
    return rng.sample(tasks, min(n, len(tasks)))


def make_weight_sync(engine: Engine, run_dir: Path) -> Any:
    """In-place for in-process engines, from disk for HTTP engines, none for weightless ones."""
    from legorl.train.sync import DiskSync, InProcessSync

    if isinstance(engine, WeightsInPlace):
        return InProcessSync(engine)
    if isinstance(engine, WeightsFromDisk):
        served = engine.served_model_dir if isinstance(engine, ServesModelDir) else None  # vLLM: only the dir it serves
        return DiskSync([engine], served, in_place=True) if served else DiskSync([engine], run_dir / "weights")
    return None  # scripted / oracle: nothing to update


def record(store: RunStore, records: list[RolloutRecord], tokenizer: Any) -> None:
    """Persist rollouts (turns first, then the trajectory with its outcome); a store that
    cannot be written (a full disk) ends the run with one message."""
    try:
        _record(store, records, tokenizer)
    except sqlite3.Error as e:
        raise RunError(f"run store {store.path}: {e}. Free space there, then `legorl train CONFIG --resume`") from None


def _record(store: RunStore, records: list[RolloutRecord], tokenizer: Any) -> None:
    for rec in records:
        t = rec.trajectory
        pieces = [[tokenizer.decode([i]) for i in turn.completion_ids] for turn in rec.turns]
        with store.transaction():  # the rollout's whole record or nothing (a kill, a full disk)
            store.start_session(t.session_id, step=t.step, instance_id=t.instance_id, harness=t.harness)
            for turn, p in zip(rec.turns, pieces, strict=True):
                store.add_turn(turn, p)
            store.add_trajectory(t)


def record_action_format(store: RunStore, cfg: RunConfig) -> None:
    """Tell the store how the configured harness takes an action from a turn (its adapter's
    `action_format`), so the metrics and monitors judge its turns by that format."""
    try:
        harness = make_harness(cfg.harness.name, **cfg.harness.harness_options(cfg.proxy.served_model))
        store.set_action_formats({harness.name: format_of(harness)})
    except (ValueError, OSError, HarnessNotInstalled) as e:
        raise RunError(f"harness {cfg.harness.name!r}: {e}") from None


def rollout_backend(cfg: RunConfig, engine: Engine) -> Any:
    """Where rollouts run (an async context manager with `group()`): one in-process worker, or
    Ray actors (`[ray] enabled`; an in-process engine is then served to them over HTTP)."""
    if not cfg.ray.enabled:
        return RolloutWorker(cfg, engine)
    from legorl.loop.ray_backend import ray_rollout_pool

    return ray_rollout_pool(cfg, engine)


class _FollowerSync:
    """A non-main rank's weight sync: it joins the collective gather of the full weights
    (`Trainer.sync_weights`) but pushes nothing; the main rank owns the engine."""

    async def push(self, lm: Any, state_dict: Any, version: int) -> None:
        return None


def build_trainer(cfg: RunConfig, engine: Engine | None) -> Trainer:
    tcfg = cfg.trainer.model_copy()
    if not tcfg.checkpoint_dir:
        tcfg.checkpoint_dir = str(cfg.run.dir / "checkpoints")
    tcfg.total_steps = cfg.run.steps
    sync = make_weight_sync(engine, cfg.run.dir) if engine is not None else _FollowerSync()
    return Trainer(tcfg, weight_sync=sync)


def _broadcast(obj: Any) -> Any:
    """Rank 0's object on every rank (trajectories of a step, or None: stop)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


async def _resume(trainer: Trainer, check: Any = None) -> int:
    """Load the newest checkpoint (`check(path, data_state)` may refuse it before the engine
    gets its weights), sync the engine; the step to continue at."""
    from legorl.train.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(trainer.cfg.checkpoint_dir)
    if ckpt is None:
        raise FileNotFoundError(
            f"--resume: no checkpoint in {trainer.cfg.checkpoint_dir}: nothing to resume "
            "(start the run again with --overwrite)"
        )
    trainer.load_checkpoint(ckpt)
    if check is not None:
        check(ckpt, trainer.data_state)
    await trainer.sync_weights()  # the engine must sample from the restored weights
    return int(trainer.data_state.get("next_step", trainer.step_count))


def check_models(cfg: RunConfig) -> None:
    """Every model the run loads exists, named by its field (before anything is written)."""
    fields = [("engine.model", cfg.engine.model), ("trainer.model", cfg.trainer.model)]
    if cfg.warm_start.episodes:
        fields.append(("warm_start.engine.model", cfg.warm_start.engine.model))
    for where, name in fields:
        try:
            check_model(name)
        except ModelNotFound as e:
            raise RunError(f"{where}: {e}") from None
    demo, trained = cfg.warm_start.engine.model, cfg.trainer.model
    if (
        cfg.warm_start.episodes
        and demo != trained
        and load_tokenizer(demo).get_vocab() != load_tokenizer(trained).get_vocab()
    ):
        raise RunError(
            f"warm_start.engine.model {demo!r} has another tokenizer than trainer.model {trained!r}: its "
            "demonstrations would be token ids the trained model does not have "
            f"(set warm_start.engine.model = {trained!r})"
        )


def _stored_run(run_dir: Path) -> dict[str, Any]:
    """The run a `--resume` continues: its store's run row (id, config)."""
    try:
        with RunStore(run_dir, readonly=True) as s:
            return s.run_info()
    except FileNotFoundError:
        raise RunError(f"--resume: {run_dir} holds no run (no run.sqlite): start it without --resume") from None


async def follow(cfg: RunConfig, *, resume: bool = False) -> dict[str, Any]:
    """A non-main rank under torchrun: train on the trajectories rank 0 broadcasts."""
    trainer = build_trainer(cfg, None)
    if resume:
        await _resume(trainer)
    steps = 0
    while (item := _broadcast(None)) is not None:
        trajs, next_step = item
        await trainer.train_step(trajs, data_state={"next_step": next_step})
        steps += 1
    return {"rank": trainer.dist.rank, "steps": steps}


async def train(
    cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, console: Console | None = None
) -> dict[str, Any]:
    console = console or Console(stderr=True)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 rolls out
        return await follow(cfg, resume=resume)
    t_run = time.monotonic()
    if resume and overwrite:
        raise RunError("--resume continues the run in run.dir, --overwrite deletes it: choose one")
    if cfg.engine.kind == "vllm" and not cfg.engine.served_model_dir:
        raise RunError(
            "engine.served_model_dir is required to train with vllm: the directory the server was "
            "launched on (new weights are written there and reloaded; see docs/scale-out.md)"
        )
    run_dir = cfg.run.dir
    check_models(cfg)
    tasks = load_task_split(cfg, cfg.run.split)
    heldout = load_task_split(cfg, cfg.heldout.split)[: cfg.heldout.tasks] if cfg.heldout.tasks else []
    stored = _stored_run(run_dir) if resume else None
    if not resume:
        claim(cfg, overwrite=overwrite)  # nothing of another run in run.dir from here on
    tokenizer = load_tokenizer(cfg.engine.model)
    engine = make_engine(cfg.engine, tokenizer)
    trainer = build_trainer(cfg, engine)
    if cfg.warm_start.checkpoint is not None and not resume:  # before the start evaluation spends its time
        try:
            check_weights_fit(trainer.lm.config, cfg.warm_start.checkpoint)
        except ValueError as e:
            raise RunError(f"warm_start.checkpoint: {e} (trainer.model is {cfg.trainer.model!r})") from None
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
            start = await _resume(trainer, lambda path, state: check_checkpoint(path, state, stored, cfg))
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
    report = Report.load(run_dir) if resume else Report(run_dir)
    if resume:
        abandoned = store.abandon_steps(start)
        console.print(
            f"resumed at step {start}"
            + (f" ({abandoned} rollouts of the interrupted attempt kept as abandoned)" if abandoned else "")
        )
    ui = None
    if cfg.run.ui:
        from legorl.monitor.ui.server import UIServerThread

        ui = UIServerThread(run_dir, port=cfg.run.ui_port)
        ui.start()
        console.print(f"live UI: {ui.url}")
    limit = asyncio.Semaphore(cfg.run.max_concurrent_rollouts)

    def on_record(rec: RolloutRecord) -> None:  # each rollout is stored the moment it is graded
        record(store, [rec], tokenizer)

    summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": []}
    trackers = open_trackers(cfg.monitor.sinks, run_dir, run_dir.name, cfg.model_dump(mode="json"))
    if trackers is not None:
        store.attach(trackers)  # every metric and alert the store records, from here on
    try:
        async with rollout_backend(cfg, engine) as worker:
            placed = getattr(worker, "placement", None)  # Ray: which node runs what
            if placed is not None:
                store.add_event("ray_placement", placed)

            async def evaluate(label: str) -> None:
                ev = await evaluate_heldout(worker, heldout, label, limit, on_record)
                report.add(ev, step=trainer.version)
                row = ev.as_dict()
                store.log_metrics(
                    trainer.step_count,
                    {
                        f"heldout/{label}/resolved_rate": ev.rate,
                        f"heldout/{label}/ci95_low": row["ci95"][0],
                        f"heldout/{label}/ci95_high": row["ci95"][1],
                        f"heldout/{label}/episodes": float(ev.episodes),
                        f"heldout/{label}/masked": float(ev.masked),
                    },
                )
                console.print(
                    f"held-out {label}: {ev.resolved}/{ev.episodes} resolved ({ev.rate:.1%}), "
                    f"{ev.masked} masked, {ev.wall_s:.0f}s"
                )

            control = None
            if start == 0 and not trainer.data_state.get("pre_gspo_done"):  # a resumed run has them in its checkpoint
                ran = False
                if heldout and "start" in cfg.heldout.at:
                    await report.timed("eval_start", evaluate("start"))
                    ran = True
                if cfg.warm_start.enabled:
                    control = await report.timed(
                        "warm_start", warm_start_phase(cfg, trainer, tasks, limit, on_record, store, console)
                    )
                    if heldout and "warm_start" in cfg.heldout.at:
                        await report.timed("eval_warm_start", evaluate("warm_start"))
                    ran = True
                trainer.data_state = {**trainer.data_state, "pre_gspo_done": True, "next_step": 0}
                if ran and ranks == 1:  # a kill in step 0 resumes at step 0 without redoing these (under
                    # torchrun a checkpoint is a collective the followers join only in train_step)
                    after = "the warm start" if cfg.warm_start.enabled else "the held-out start evaluation"
                    await asyncio.to_thread(save_or_fail, trainer, after, None)
            t_gspo = time.monotonic()
            step = start
            steps = gspo_steps(cfg, trainer, worker, tasks, start, limit, on_record, store, ranks)
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
            if placed is not None:  # and again after the steps: actors lost on the way, rollouts retried
                store.add_event("ray_placement", worker.placement)
            if heldout and "end" in cfg.heldout.at:
                await report.timed("eval_end", evaluate("end"))
            if heldout and control is not None:
                trainer.save_checkpoint()  # the trained policy is kept; the control then starts from the warm start
                await report.timed("control", control_phase(cfg, trainer, control, store))
                await report.timed("eval_control", evaluate("control"))
    finally:
        if ranks > 1:
            _broadcast(None)  # followers leave their loop
        if ui is not None:
            ui.stop()
        await engine.close()
        if report.rows:
            report.finish(time.monotonic() - t_run, budget_s=cfg.run.time_budget_s)
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
    if report.rows:
        summary["heldout"] = report.as_dict()
    return summary


async def collect_step(
    cfg: RunConfig,
    trainer: Trainer,
    worker: RolloutBackend,
    tasks: list[Task],
    step: int,
    limit: asyncio.Semaphore,
    on_record: OnRecord,
    store: RunStore,
) -> tuple[list[RolloutRecord], float, float]:
    """A step's rollouts: its tasks (a pure function of seed and step, so a resume samples
    the same), a group of rollouts each, every one stored as it is graded. Returns the
    records and the phase's start and end (monotonic)."""
    t0 = time.monotonic()
    store.begin_step(step, policy_version=trainer.version)
    batch = sample_tasks(tasks, cfg.run.tasks_per_step, cfg.run.seed, step)
    groups = await asyncio.gather(
        *(worker.group(t, cfg.run.group_size, step=step, limit=limit, on_record=on_record) for t in batch)
    )
    return [r for g in groups for r in g], t0, time.monotonic()


def staleness(rec: RolloutRecord, version: int) -> int:
    """How many policy versions behind `version` the trajectory's oldest sampled token is."""
    versions = [t.policy_version for t in rec.turns if not t.side_call]
    return version - min(versions) if versions else 0


async def train_on(
    cfg: RunConfig,
    trainer: Trainer,
    records: list[RolloutRecord],
    step: int,
    store: RunStore,
    ranks: int,
    t0: float,
    t1: float,
) -> dict[str, float]:
    """Advantages (once: stored and trained on) → train → close the step in the store →
    checkpoint → sync the engine. Past `max_staleness` a trajectory is dropped or kept (`stale`)."""
    k = cfg.run.max_staleness
    ages = [staleness(r, trainer.version) for r in records]
    kept = [r for r, a in zip(records, ages, strict=True) if a <= k or cfg.run.stale == "correct"] if k else records
    trajs = [r.trajectory for r in kept]
    adv = trainer.advantages(trajs)
    store.set_advantages({t.session_id: a for t, a in zip(trajs, adv.values, strict=True) if a is not None})
    t2 = time.monotonic()
    sampled_by = trainer.version  # the weights these rollouts were (mostly) sampled with
    if ranks > 1:
        _broadcast((trajs, step + 1))
    metrics = await asyncio.to_thread(
        trainer.step,
        trajs,
        data_state={**trainer.data_state, "next_step": step + 1},  # and the run's id (run_dir.py)
        advantages=adv,
        checkpoint=False,
    )
    metrics.update(rollout_metrics(records, sampled_by, store.action_formats()))
    metrics.update(
        {
            "time/rollout_s": t1 - t0,
            "time/store_s": t2 - t1,
            "rollout/count": float(len(records)),
            "rollout/rollouts_per_min": 60 * len(records) / max(t1 - t0, 1e-9),
            "async/staleness_max": float(max(ages, default=0)),
            "async/staleness_mean": sum(ages) / max(len(ages), 1),
            "async/dropped_stale": float(len(records) - len(kept)),
        }
    )
    store.log_metrics(step, metrics)
    store.end_step(step)  # closed in the store before its checkpoint is published (a resume skips it)
    if trainer.checkpoint_due():  # the same collective order as the followers' train_step: save, then sync
        await asyncio.to_thread(save_or_fail, trainer, f"step {step}", step)
    try:
        await trainer.sync_weights()
    except (EngineError, OSError) as e:
        raise RunError(
            f"weight sync to the engine failed after step {step} (its checkpoint is saved): {e}. "
            "Restart the engine, then `legorl train CONFIG --resume` continues at step "
            f"{step + 1}"
        ) from None
    t3 = time.monotonic()
    timing = {"time/train_sync_s": t3 - t2, "time/step_s": t3 - t0}
    store.log_metrics(step, timing)
    metrics.update(timing)
    return metrics


def save_or_fail(trainer: Trainer, after: str, rerun: int | None) -> None:
    """Checkpoint; a full disk ends the run with one line saying what to do next."""
    try:
        trainer.save_checkpoint()
    except OSError as e:
        then = (
            f"`legorl train CONFIG --resume` re-runs step {rerun} (its rollouts so far are kept as abandoned)"
            if rerun is not None
            else "start the run again with --overwrite"
        )
        raise RunError(f"{e} (after {after}). Free space there, then {then}") from None


async def gspo_step(
    cfg: RunConfig,
    trainer: Trainer,
    worker: RolloutBackend,
    tasks: list[Task],
    step: int,
    limit: asyncio.Semaphore,
    on_record: OnRecord,
    store: RunStore,
    ranks: int,
) -> dict[str, float]:
    """One synchronous GSPO step: its rollouts, then training on them."""
    records, t0, t1 = await collect_step(cfg, trainer, worker, tasks, step, limit, on_record, store)
    return await train_on(cfg, trainer, records, step, store, ranks, t0, t1)


async def gspo_steps(
    cfg: RunConfig,
    trainer: Trainer,
    worker: RolloutBackend,
    tasks: list[Task],
    start: int,
    limit: asyncio.Semaphore,
    on_record: OnRecord,
    store: RunStore,
    ranks: int,
) -> AsyncIterator[dict[str, float]]:
    """Steps `start`..`run.steps`, yielding each one's metrics. With `max_staleness = k > 0`
    the rollouts of steps s+1..s+k are already running while step s trains (their requests
    in flight continue across the weight update; every turn records the policy version
    that produced it); `async/trainer_idle_s` is how long the trainer waited for rollouts."""
    k = cfg.run.max_staleness
    if k == 0:
        for step in range(start, cfg.run.steps):
            yield await gspo_step(cfg, trainer, worker, tasks, step, limit, on_record, store, ranks)
        return
    pending: dict[int, asyncio.Task[tuple[list[RolloutRecord], float, float]]] = {}

    def launch(step: int) -> None:
        if step < cfg.run.steps and step not in pending:
            pending[step] = asyncio.create_task(
                collect_step(cfg, trainer, worker, tasks, step, limit, on_record, store)
            )

    try:
        for s in range(start, start + k + 1):
            launch(s)
        for step in range(start, cfg.run.steps):
            t_wait = time.monotonic()
            records, t0, t1 = await pending.pop(step)
            idle = time.monotonic() - t_wait
            metrics = await train_on(cfg, trainer, records, step, store, ranks, t0, t1)
            launch(step + k + 1)
            metrics["async/trainer_idle_s"] = idle
            store.log_metrics(step, {"async/trainer_idle_s": idle})
            yield metrics
    finally:  # stopped early (a monitor, an error): rollouts of later steps are abandoned
        for t in pending.values():
            t.cancel()
        await asyncio.gather(*pending.values(), return_exceptions=True)


async def warm_start_phase(
    cfg: RunConfig,
    trainer: Trainer,
    tasks: list[Task],
    limit: asyncio.Semaphore,
    on_record: OnRecord,
    store: RunStore,
    console: Console,
) -> dict[str, Any] | None:
    """Record demonstrations through a worker of the demonstrator, SFT on them, sync the
    engine. Returns the warm-start snapshot the control starts from (None without one)."""
    ws = cfg.warm_start
    if ws.checkpoint is not None:
        try:
            loaded = await asyncio.to_thread(load_weights, trainer.lm, ws.checkpoint)
        except ValueError as e:
            raise RunError(f"warm_start.checkpoint: {e} (trainer.model is {cfg.trainer.model!r})") from None
        console.print(f"warm start: weights from {loaded}")
        trainer.version += 1
        await trainer.sync_weights()
        return None
    demonstrator = make_engine(ws.engine, load_tokenizer(ws.engine.model))
    t0 = time.monotonic()
    try:
        async with RolloutWorker(cfg, demonstrator) as w:
            recs = await record_demonstrations(w, demo_tasks(tasks, ws.episodes, cfg.run.seed), limit, on_record)
    finally:
        await demonstrator.close()
    demos = imitated(recs, ws.keep)
    resolved = sum(1 for r in recs if r.trajectory.outcome and r.trajectory.outcome.status is Status.RESOLVED)
    console.print(
        f"warm start: {len(recs)} demonstrations in {time.monotonic() - t0:.0f}s "
        f"({resolved} resolved), imitating {len(demos)}"
    )
    if not demos:
        raise RunError(
            f"warm start: none of the {len(recs)} demonstrations can be imitated "
            f"(statuses: {sorted({r.trajectory.outcome.status.value for r in recs})})"
        )

    def log(step: int, m: dict[str, float]) -> None:
        store.log_metrics(WARM_START_STEP, {**m, "sft/step": float(step)})

    trainer.policy.train()
    await asyncio.to_thread(
        sft, trainer.policy, demos, ws.sft_config(cfg.run.seed), trainer.optimizer, log=log, opts=trainer.opts
    )
    trainer.version += 1  # new weights: turns sampled from now on say so
    await trainer.sync_weights()
    if not ws.control_steps:
        return None
    return {
        "lm": {k: v.detach().clone() for k, v in trainer.lm.state_dict().items()},
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "demos": demos,
    }


async def control_phase(cfg: RunConfig, trainer: Trainer, snap: dict[str, Any], store: RunStore) -> None:
    """The same budget spent on more SFT: back to the warm-start weights and optimizer,
    `control_steps` more SFT steps at the final SFT learning rate, sync the engine."""
    trainer.lm.load_state_dict(snap["lm"])
    trainer.optimizer.load_state_dict(snap["optimizer"])
    trainer.policy.train()
    await asyncio.to_thread(
        sft,
        trainer.policy,
        snap["demos"],
        cfg.warm_start.control_config(cfg.run.seed),
        trainer.optimizer,
        opts=trainer.opts,
    )
    trainer.version += 1
    await trainer.sync_weights()
