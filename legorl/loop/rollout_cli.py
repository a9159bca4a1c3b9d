"""`legorl rollout`: one rollout of any harness on one task, printed as a JSON line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from legorl.config import validate
from legorl.engine.registry import make_engine
from legorl.harness.registry import COMMAND
from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.loop.worker import RolloutWorker
from legorl.models import load_tokenizer
from legorl.tasks.kinds import unhonoured
from legorl.tasks.loader import get_task, load_tasks


async def run_one(
    cfg: RunConfig,
    tasks: Path,
    instance: str,
    *,
    harness: str | None = None,
    command_file: Path | None = None,
    engine: str | None = None,
    model: str | None = None,
    sandbox: str | None = None,
    max_turns: int | None = None,
    out: Path | None = None,
) -> str:
    """One rollout; every option left None comes from `cfg` (a run config, or the defaults),
    so `--config examples/swebench-claude-code.toml` runs Claude Code as that config says."""
    try:
        task = get_task(load_tasks(tasks, None), instance)
    except KeyError as e:
        raise RunError(f"--instance: {e.args[0]}") from None
    cfg = cfg.model_copy(deep=True)
    given = lambda **kw: {k: v for k, v in kw.items() if v is not None}  # noqa: E731
    engine_cfg = {**cfg.engine.model_dump(), **given(kind=engine, model=model)}
    if engine_cfg["kind"] == "oracle":
        engine_cfg["options"] = {**engine_cfg.get("options", {}), "tasks": str(tasks)}
    if harness is None and command_file is not None:
        harness = COMMAND
    harness_cfg = {
        **cfg.harness.model_dump(),
        **given(name=harness, max_turns=max_turns, command_file=command_file),
    }
    if harness is not None and harness != cfg.harness.name:  # another harness: the config's options were its
        harness_cfg.update(options={}, mix={})
    sandbox_cfg = {**cfg.sandbox.model_dump(), **given(backend=sandbox)}
    cfg = validate(
        RunConfig,
        {**cfg.model_dump(), "engine": engine_cfg, "harness": harness_cfg, "sandbox": sandbox_cfg},
        "rollout options",
    )
    if why := unhonoured(tasks, cfg.sandbox.changed()):  # the config's [sandbox] against --tasks' kind
        raise RunError(why)
    eng = make_engine(cfg.engine, load_tokenizer(cfg.engine.model))
    try:
        async with RolloutWorker(cfg, eng) as w:
            rec = await w.rollout(task)
    finally:
        await eng.close()
    line: dict[str, Any] = rec.result.to_json()
    st = rec.trajectory.stats
    line.update(
        session=rec.trajectory.session_id,
        turns=len(rec.turns),
        segments=st.segments,
        sampled_tokens=st.sampled_tokens,
        side_calls=len(rec.trajectory.side_turns),
    )
    line["evidence"] = {k: v for k, v in line.get("evidence", {}).items() if k != "diff"}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "turns.jsonl", "a") as f:
            for t in rec.turns:
                f.write(json.dumps(t.to_dict()) + "\n")
        with open(out / "trajectories.jsonl", "a") as f:
            f.write(json.dumps(rec.trajectory.to_dict(), default=str) + "\n")
    return json.dumps(line, default=str)
