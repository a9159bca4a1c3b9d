"""Shared helpers of the harness end-to-end tests: one rollout of a native harness on a
shipped task through the production path (`legorl.loop.worker.RolloutWorker`: proxy
session → session socket → agent sandbox with the harness layers mounted → grading)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from legorl.engine.registry import EngineConfig, make_engine
from legorl.harness.install import HARNESS_LAYERS, is_built
from legorl.loop.config import RunConfig
from legorl.loop.worker import RolloutRecord, RolloutWorker
from legorl.models import load_tokenizer
from legorl.tasks.loader import load_shipped, shipped_tasks_dir
from legorl.types import Task

TASKS_FILE = shipped_tasks_dir() / "train.jsonl"


def harness_missing(name: str) -> str | None:
    """Why `name` cannot run here (a layer not built), or None."""
    missing = [layer for layer in HARNESS_LAYERS[name] if not is_built(layer)]
    return f"harness layers {missing} not built: run scripts/setup_harnesses.sh" if missing else None


def docker_missing() -> str | None:
    import subprocess

    if shutil.which("docker") is None:
        return "no docker client"
    r = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    return None if r.returncode == 0 else "no Docker engine: run scripts/setup_sandbox.sh"


def shipped(n: int = 2) -> list[Task]:
    return load_shipped("train")[:n]


@dataclass
class Setup:
    harness: str
    engine: str = "oracle"  # oracle | hf
    backend: str = "local"
    max_turns: int = 12
    max_tokens: int = 4096  # proxy cap on completion tokens
    max_context: int = 32768  # proxy window: smaller forces 'prompt too long'
    timeout_s: float = 420.0
    options: dict[str, Any] | None = None  # adapter options
    engine_options: dict[str, Any] | None = None
    model: str = "tiny-qwen3"  # the engine's model (hf engine: e.g. smollm2-135m-instruct)


def run_config(s: Setup) -> RunConfig:
    engine: dict[str, Any] = {"kind": s.engine, "model": s.model, "max_context": 32768}
    if s.engine == "oracle":
        engine["options"] = {"tasks": str(TASKS_FILE), **(s.engine_options or {})}
    elif s.engine == "hf":
        engine["seed"] = 0
    return RunConfig.model_validate(
        {
            "engine": engine,
            "proxy": {"port": 0, "max_tokens": s.max_tokens, "max_context": s.max_context, "request_timeout_s": 300},
            "sandbox": {
                "backend": s.backend,
                "agent_timeout_s": s.timeout_s,
                "retries": 0,
                "cpus": 2.0,
                "memory_mb": 3072,
            },
            "harness": {"name": s.harness, "max_turns": s.max_turns, "options": s.options or {}},
        }
    )


async def rollouts(
    s: Setup, tasks: list[Task], engine: Any = None, wrap: Callable[[Any], Any] | None = None
) -> list[RolloutRecord]:
    """Run `tasks` concurrently with one worker (one proxy, one engine); `wrap` wraps the
    worker's adapter (e.g. `legorl.harness.nettrace.NetTraced`)."""
    import asyncio

    cfg = run_config(s)
    if engine is None:
        engine = make_engine(EngineConfig.model_validate(cfg.engine.model_dump()), load_tokenizer(s.model))
    try:
        async with RolloutWorker(cfg, engine) as w:
            if wrap is not None:
                w.harness = wrap(w.harness)
            return list(await asyncio.gather(*(w.rollout(t) for t in tasks)))
    finally:
        await engine.close()


def prompt_window_between(rec: RolloutRecord, turn: int) -> int:
    """A proxy window in which turn `turn` (and only a later one) cannot fit: midway between
    the end of turn-1's completion and turn's prompt (the big tool output lies between)."""
    main = [t for t in rec.turns if not t.side_call]
    prev, cur = main[turn - 1], main[turn]
    lo = len(prev.prompt_ids) + len(prev.completion_ids)
    hi = len(cur.prompt_ids)
    assert hi - lo > 1000, f"turn {turn} adds only {hi - lo} tokens: no room to place a window"
    return (lo + hi) // 2


def summary(rec: RolloutRecord) -> dict[str, Any]:
    o = rec.trajectory.outcome
    return {
        "status": o.status.value if o else None,
        "reward": o.reward if o else None,
        "turns": len(rec.turns),
        "segments": len(rec.trajectory.segments),
        "side": rec.trajectory.side_turns,
        "agent": rec.result.agent.details if rec.result.agent else None,
        "stderr": rec.result.agent.stderr_tail[-800:] if rec.result.agent else None,
    }


def check_recorded(rec: RolloutRecord) -> None:
    """Every turn has ids and logprobs; every sampled token of a main turn is in a segment."""
    assert rec.turns, "no turn recorded"
    for t in rec.turns:
        assert t.prompt_ids and t.completion_ids, f"turn {t.index} lacks ids"
        assert len(t.logprobs) == len(t.completion_ids), f"turn {t.index}: logprobs do not match ids"
    traj = rec.trajectory
    sampled = sum(len(t.completion_ids) for t in rec.turns if not t.side_call)
    assert traj.stats.sampled_tokens == sampled == sum(sum(s.loss_mask) for s in traj.segments)
    by_index = {t.index: t for t in rec.turns}
    for seg in traj.segments:  # each turn's prompt+completion is a prefix of its segment
        for i in seg.turn_indices:
            t = by_index[i]
            n, m = len(t.prompt_ids), len(t.completion_ids)
            assert seg.token_ids[: n + m] == t.prompt_ids + t.completion_ids, f"turn {i} not in its segment"
            assert seg.loss_mask[n : n + m] == [1] * m and seg.logprobs[n : n + m] == t.logprobs
    assert sorted(traj.side_turns) == sorted(t.index for t in rec.turns if t.side_call)


class BrokenEngine:
    """An engine whose every call fails (a dead inference server)."""

    name = "broken"
    policy_version = 0
    max_context = 32768  # the proxy reads every engine's window

    def __init__(self) -> None:
        self.tokenizer = load_tokenizer("tiny-qwen3")
        self.calls = 0

    async def stream(self, prompt_ids: list[int], params: Any):  # noqa: ANN201
        from legorl.engine.base import EngineError

        self.calls += 1
        raise EngineError("inference server unreachable")
        yield  # pragma: no cover - makes this an async generator

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        from legorl.engine.base import collect

        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def close(self) -> None:
        return None
