"""The phases of one `legorl train`, in the order `train.py` runs them:

1. `evaluate(run, "start")`: the held-out split, untrained;
2. `warm_start(run)`: demonstrations through the loop, SFT on them (or weights from a
   checkpoint), then `evaluate(run, "warm_start")`;
3. `gspo_steps(run, start)`: sample tasks → groups of rollouts → store → advantages → GSPO
   → checkpoint → weight sync, synchronous or `max_staleness` steps ahead;
4. `evaluate(run, "end")`, then `control(run, ...)`: the same budget spent on more SFT from
   the warm start, and `evaluate(run, "control")`.

Every rollout is written to the store as it is graded (`Run.on_record`) before any phase
trains on it. The trainer owns the policy version: each phase that changes the weights
says so (`Trainer.bump_version` / `restore`) and syncs the engine before the next rollout.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from legorl.compute_thread import in_own_thread
from legorl.engine.base import EngineError
from legorl.engine.registry import make_engine
from legorl.loop import memory
from legorl.loop.errors import RunError
from legorl.loop.heldout import evaluate_heldout
from legorl.loop.metrics import rollout_metrics
from legorl.loop.record_logprobs import store_trainer_logprobs
from legorl.loop.run import Run
from legorl.loop.run_dir import CONTROL_START_FILE, KL_REFERENCE_FILE
from legorl.loop.run_inputs import probe_engine
from legorl.loop.startup import broadcast, sample_tasks
from legorl.loop.warm_start import WARM_START_STEP, demo_tasks, imitated, record_demonstrations
from legorl.loop.worker import RolloutRecord, RolloutWorker
from legorl.models import load_tokenizer
from legorl.train.trainer import Trainer, WeightsSnapshot
from legorl.types import Status, Trajectory

PRE_GSPO_EVALS = ("start", "warm_start")  # evaluations done before the first checkpoint a resume can load
ENGINE_LOST_SHARE = 0.5  # a step with more of its rollouts lost to the engine is not trained


def evaluated(data_state: dict[str, Any]) -> set[str]:
    """The held-out evaluations (phases) whose rows are final as of a checkpoint: a resume
    keeps them and redoes any other (its partial rollouts kept as abandoned). A checkpoint
    written before this was recorded is one after the phases before GSPO."""
    return set(data_state.get("evaluated", PRE_GSPO_EVALS))


def lost_to_engine(records: list[RolloutRecord]) -> int:
    """Rollouts masked because the engine failed under them (status or cause `engine_error`)."""
    return sum(
        1
        for r in records
        if (o := r.trajectory.outcome) is not None
        and o.masked
        and (o.status is Status.ENGINE_ERROR or o.evidence.get("cause") == "engine_error")
    )


@dataclass(frozen=True)
class ControlStart:
    """Where the control begins: the warm start's weights and optimizer, and its demonstrations."""

    weights: WeightsSnapshot
    demos: list[Trajectory]


async def evaluate(run: Run, label: str) -> None:
    """The held-out split once through the loop; its row goes to the report, the store and the
    console. A mixed-harness run evaluates once per harness (`label@harness`): held-out is
    pinned per harness, so each harness's gain is its own."""
    h = run.cfg.harness
    if not h.mix:
        await _evaluate_in(run, label, None)
        return
    for name in h.names():
        await _evaluate_in(run, f"{label}@{name}", name)


async def _evaluate_in(run: Run, label: str, harness: str | None) -> None:
    ev = await evaluate_heldout(run.rollouts, run.heldout, label, run.limit, run.on_record, harness=harness)
    run.report.add(ev, step=run.trainer.version)
    low, high = ev.as_dict()["ci95"]
    run.store.log_metrics(
        run.trainer.step_count,
        {
            f"heldout/{label}/resolved_rate": ev.rate,
            f"heldout/{label}/ci95_low": low,
            f"heldout/{label}/ci95_high": high,
            f"heldout/{label}/episodes": float(ev.episodes),
            f"heldout/{label}/masked": float(ev.masked),
        },
    )
    run.console.print(
        f"held-out {label}: {ev.resolved}/{ev.episodes} resolved ({ev.rate:.1%}), {ev.masked} masked, {ev.wall_s:.0f}s"
    )


async def warm_start(run: Run) -> list[Trajectory] | None:
    """Record demonstrations through a worker of the demonstrator, SFT on them, sync the
    engine; or load `[warm_start] checkpoint`. Returns the demonstrations the control trains
    on (None without a control); the control's weights are the trainer's as this returns."""
    cfg, trainer, ws = run.cfg, run.trainer, run.cfg.warm_start
    if ws.checkpoint is not None:
        try:
            loaded = await in_own_thread(trainer.load_weights, ws.checkpoint)
        except ValueError as e:
            raise RunError(f"warm_start.checkpoint: {e} (trainer.model is {cfg.trainer.model!r})") from None
        run.console.print(f"warm start: weights from {loaded}")
        trainer.bump_version()
        await trainer.sync_weights()
        return None
    demonstrator = make_engine(ws.engine, load_tokenizer(ws.engine.model))
    t0 = time.monotonic()
    try:
        await probe_engine(demonstrator, "warm_start.engine")  # one that does not answer: one line
        async with RolloutWorker(cfg, demonstrator) as w:
            tasks = demo_tasks(run.tasks, ws.episodes, cfg.run.seed, ws.distinct_tasks)
            h = cfg.harness
            recs = await record_demonstrations(
                w,
                tasks,
                run.limit,
                run.on_record,
                (lambda k, t: h.draw(cfg.run.seed, WARM_START_STEP - k, t.instance_id))
                if h.mix
                else (lambda k, t: None),
            )
    finally:
        await demonstrator.close()
    demos = imitated(recs, ws.keep)
    resolved = sum(1 for r in recs if r.trajectory.outcome and r.trajectory.outcome.status is Status.RESOLVED)
    run.console.print(
        f"warm start: {len(recs)} demonstrations in {time.monotonic() - t0:.0f}s "
        f"({resolved} resolved), imitating {len(demos)}"
    )
    if not demos:
        raise RunError(
            f"warm start: none of the {len(recs)} demonstrations can be imitated "
            f"(statuses: {sorted({r.trajectory.outcome.status.value for r in recs})})"
        )

    def log(step: int, m: dict[str, float]) -> None:
        run.store.log_metrics(WARM_START_STEP, {**m, "sft/step": float(step)})

    await in_own_thread(trainer.sft, demos, ws.sft_config(cfg.run.seed), log)
    trainer.bump_version()  # new weights: turns sampled from now on say so
    await trainer.sync_weights()
    return demos if ws.control_steps else None


def keep_control_start(run: Run, demos: list[Trajectory]) -> None:
    """Write where the control begins (the trainer's weights and AdamW state now, and the
    demonstrations) to `RUN_DIR/control_start.pt`: GSPO moves the weights on and checkpoints
    are pruned, so without it a `--resume` after the warm start would have no warm-start
    weights to run the control from. The file is the only copy: held in memory through GSPO,
    a model and its optimizer state (1.6 GB for SmolLM2-135M in fp32) would sit unused."""
    trainer = run.trainer
    state = {"lm": trainer.lm.state_dict(), "optimizer": trainer.optimizer.state_dict(), "demos": demos}
    save_whole(state, run.cfg.run.dir / CONTROL_START_FILE)


def save_whole(obj: Any, path: Path) -> None:
    """`torch.save` through a temporary file and a rename, so a kill never leaves half a file;
    a full disk is one line naming the path, not a traceback."""
    tmp = path.with_suffix(".tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RunError(f"cannot write {path} ({e.strerror or e}): free space there, then start again") from None


def hold_kl_reference(run: Run) -> None:
    """π_ref for `[trainer] kl_coef`: the policy as GSPO starts (the warm start's weights),
    written to `RUN_DIR/kl_reference.pt` the first time. A resumed run reads it back, so that it
    pulls toward the weights GSPO started from, not toward wherever the run was stopped."""
    if run.cfg.trainer.kl_coef <= 0:
        return
    path = run.cfg.run.dir / KL_REFERENCE_FILE
    if path.exists():
        run.trainer.set_reference(torch.load(path, map_location="cpu", weights_only=True))
        return
    save_whole(run.trainer.set_reference(), path)


def control_start_kept(run: Run) -> bool:
    """Whether the warm start wrote where the control begins (an older legorl did not)."""
    return (run.cfg.run.dir / CONTROL_START_FILE).exists()


def load_control_start(run: Run) -> ControlStart | None:
    """The control's start as the warm start wrote it (None when it did not)."""
    path = run.cfg.run.dir / CONTROL_START_FILE
    if not path.exists():
        return None
    data = torch.load(path, map_location="cpu", weights_only=False)  # our own file: tensors and trajectories
    return ControlStart(WeightsSnapshot(lm=data["lm"], optimizer=data["optimizer"]), list(data["demos"]))


async def control(run: Run) -> None:
    """The same budget spent on more SFT: back to the warm-start weights and optimizer (read
    from `control_start.pt`, then dropped), `control_steps` more SFT steps at the final SFT
    learning rate, sync the engine."""
    trainer = run.trainer

    def restored() -> list[Trajectory]:
        start = load_control_start(run)
        if start is None:
            raise RunError(f"no {CONTROL_START_FILE} in {run.cfg.run.dir}: the control cannot start")
        trainer.restore(start.weights)
        return start.demos  # the loaded copy of the weights and AdamW state is not kept through the SFT

    demos = await in_own_thread(restored)
    await in_own_thread(trainer.sft, demos, run.cfg.warm_start.control_config(run.cfg.run.seed))
    trainer.bump_version()
    await trainer.sync_weights()


async def collect_step(run: Run, step: int) -> tuple[list[RolloutRecord], float, float]:
    """A step's rollouts: its tasks (a pure function of seed and step, so a resume samples
    the same), a group of rollouts each, every one stored as it is graded. Returns the
    records and the phase's start and end (monotonic)."""
    cfg = run.cfg
    t0 = time.monotonic()
    run.store.begin_step(step, policy_version=run.trainer.version)
    batch = sample_tasks(run.tasks, cfg.run.tasks_per_step, cfg.run.seed, step)
    h = cfg.harness
    groups = await asyncio.gather(
        *(
            run.rollouts.group(
                t,
                cfg.run.group_size,
                step=step,
                limit=run.limit,
                on_record=run.on_record,
                harness=h.draw(cfg.run.seed, step, t.instance_id) if h.mix else None,
            )
            for t in batch
        )
    )
    return [r for g in groups for r in g], t0, time.monotonic()


def staleness(rec: RolloutRecord, version: int) -> int:
    """How many policy versions behind `version` the trajectory's oldest sampled token is."""
    versions = [t.policy_version for t in rec.turns if not t.side_call]
    return version - min(versions) if versions else 0


async def train_on(run: Run, records: list[RolloutRecord], step: int, t0: float, t1: float) -> dict[str, float]:
    """Advantages (once: stored and trained on) → train → close the step in the store →
    checkpoint → sync the engine. Past `max_staleness` a trajectory is dropped or kept (`stale`)."""
    cfg, trainer, store = run.cfg, run.trainer, run.store
    lost = lost_to_engine(records)
    if lost > ENGINE_LOST_SHARE * len(records):  # the engine died under the step: redo it, not keep it
        raise RunError(
            f"step {step}: {lost} of {len(records)} rollouts were lost to the engine (engine_error), so the "
            f"step is not trained or checkpointed. Check the engine, then `legorl train CONFIG --resume` "
            f"re-runs step {step} (these rollouts are kept as abandoned)"
        )
    k = cfg.run.max_staleness
    ages = [staleness(r, trainer.version) for r in records]
    kept = [r for r, a in zip(records, ages, strict=True) if a <= k or cfg.run.stale == "correct"] if k else records
    trajs = [r.trajectory for r in kept]
    adv = trainer.advantages(trajs)
    store.set_advantages({t.session_id: a for t, a in zip(trajs, adv.values, strict=True) if a is not None})
    t2 = time.monotonic()
    sampled_by = trainer.version  # the weights these rollouts were (mostly) sampled with
    if run.ranks > 1:
        broadcast((trajs, step + 1))
    metrics = await in_own_thread(
        trainer.step,
        trajs,
        data_state={**trainer.data_state, "next_step": step + 1},  # and the run's id (run_dir.py)
        advantages=adv,
        checkpoint=False,
        keep_logprobs=cfg.monitor.trainer_logprobs_max_tokens,
    )
    metrics.update(store_trainer_logprobs(store, trajs, trainer.kept_logprobs))  # the token view's trainer side
    given = {t.session_id: a for t, a in zip(trajs, adv.values, strict=True)}  # for the token ledger
    metrics.update(rollout_metrics(records, sampled_by, store.action_formats(), given))
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
        await in_own_thread(save_or_fail, trainer, f"step {step}", step)
    try:
        await trainer.sync_weights()
    except (EngineError, OSError) as e:
        raise RunError(
            f"weight sync to the engine failed after step {step} (its checkpoint is saved): {e}. "
            f"Restart the engine, then `legorl train CONFIG --resume` continues at step {step + 1}"
        ) from None
    t3 = time.monotonic()
    timing = {"time/train_sync_s": t3 - t2, "time/step_s": t3 - t0, **memory.step_memory()}
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


async def gspo_step(run: Run, step: int) -> dict[str, float]:
    """One synchronous GSPO step: its rollouts, then training on them."""
    records, t0, t1 = await collect_step(run, step)
    return await train_on(run, records, step, t0, t1)


async def gspo_steps(run: Run, start: int) -> AsyncIterator[dict[str, float]]:
    """Steps `start`..`run.steps`, yielding each one's metrics. With `max_staleness = k > 0`
    the rollouts of steps s+1..s+k are already running while step s trains (their requests
    in flight continue across the weight update; every turn records the policy version
    that produced it); `async/trainer_idle_s` is how long the trainer waited for rollouts."""
    k, steps = run.cfg.run.max_staleness, run.cfg.run.steps
    if k == 0:
        for step in range(start, steps):
            yield await gspo_step(run, step)
        return
    pending: dict[int, asyncio.Task[tuple[list[RolloutRecord], float, float]]] = {}

    def launch(step: int) -> None:
        if step < steps and step not in pending:
            pending[step] = asyncio.create_task(collect_step(run, step))

    try:
        for s in range(start, start + k + 1):
            launch(s)
        for step in range(start, steps):
            t_wait = time.monotonic()
            records, t0, t1 = await pending.pop(step)
            idle = time.monotonic() - t_wait
            metrics = await train_on(run, records, step, t0, t1)
            launch(step + k + 1)
            metrics["async/trainer_idle_s"] = idle
            run.store.log_metrics(step, {"async/trainer_idle_s": idle})
            yield metrics
    finally:  # stopped early (a monitor, an error): rollouts of later steps are abandoned
        for t in pending.values():
            t.cancel()
        await asyncio.gather(*pending.values(), return_exceptions=True)
