"""What one `legorl train` is built from, before its first phase: the task splits, the models
checked, the trainer and its weight sync, where rollouts run, a resumed run's checkpoint.

Everything here either returns a part of the run or refuses the config with one line
(`RunError`) before the run directory is written; `train.py` assembles the parts into a
`Run` (`run.py`) and hands it to the phases (`phases.py`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from legorl.compute_thread import in_own_thread
from legorl.engine.base import Engine, ServesModelDir, WeightsFromDisk, WeightsInPlace
from legorl.harness.actions import format_of
from legorl.harness.install import HarnessNotInstalled
from legorl.harness.registry import make_harness
from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.loop.worker import RolloutBackend, RolloutWorker
from legorl.models import ModelNotFound, check_model, load_tokenizer
from legorl.quickstart.source import SOURCE_NAME, ensure_task_file
from legorl.sandbox.images import ImageStore
from legorl.store.run_store import RunStore
from legorl.tasks.loader import TaskFileError, load_shipped, load_tasks
from legorl.train.sync import WeightSync
from legorl.train.trainer import Trainer
from legorl.types import Task


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


def make_weight_sync(engine: Engine, run_dir: Path) -> WeightSync | None:
    """In-place for in-process engines, from disk for HTTP engines, none for weightless ones."""
    from legorl.train.sync import DiskSync, InProcessSync

    if isinstance(engine, WeightsInPlace):
        return InProcessSync(engine)
    if isinstance(engine, WeightsFromDisk):
        served = engine.served_model_dir if isinstance(engine, ServesModelDir) else None  # vLLM: only the dir it serves
        return DiskSync([engine], served, in_place=True) if served else DiskSync([engine], run_dir / "weights")
    return None  # scripted / oracle: nothing to update


def record_action_format(store: RunStore, cfg: RunConfig) -> None:
    """Tell the store how the configured harness takes an action from a turn (its adapter's
    `action_format`), so the metrics and monitors judge its turns by that format."""
    try:
        harness = make_harness(cfg.harness.name, **cfg.harness.harness_options(cfg.proxy.served_model))
        store.set_action_formats({harness.name: format_of(harness)})
    except (ValueError, OSError, HarnessNotInstalled) as e:
        raise RunError(f"harness {cfg.harness.name!r}: {e}") from None


def rollout_backend(cfg: RunConfig, engine: Engine) -> AbstractAsyncContextManager[RolloutBackend]:
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


def broadcast(obj: Any) -> Any:
    """Rank 0's object on every rank (trajectories of a step, or None: stop)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


async def resume_from_checkpoint(trainer: Trainer, check: Callable[[Path, dict[str, Any]], None] | None = None) -> int:
    """Load the newest checkpoint (`check(path, data_state)` may refuse it before the engine
    gets its weights), sync the engine; the step to continue at."""
    from legorl.train.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(trainer.cfg.checkpoint_dir)
    if ckpt is None:
        raise FileNotFoundError(
            f"--resume: no checkpoint in {trainer.cfg.checkpoint_dir}: nothing to resume "
            "(start the run again with --overwrite)"
        )
    await in_own_thread(trainer.load_checkpoint, ckpt)
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


def stored_run(run_dir: Path) -> dict[str, Any]:
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
        await resume_from_checkpoint(trainer)
    steps = 0
    while (item := broadcast(None)) is not None:
        trajs, next_step = item
        await trainer.train_step(trajs, data_state={"next_step": next_step})
        steps += 1
    return {"rank": trainer.dist.rank, "steps": steps}
