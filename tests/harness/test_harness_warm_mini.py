"""The warm mini-swe-agent harness: one long-lived mini-swe-agent process, its own agent loop
and config, every command in the rollout's local sandbox, model calls to the rollout's own
proxy session — driven through RolloutWorker like every rollout of `legorl train`."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from legorl.engine.registry import make_engine
from legorl.harness.install import HarnessNotInstalled, require
from legorl.loop.config import RunConfig
from legorl.loop.startup import load_task_split
from legorl.loop.worker import RolloutWorker
from legorl.models import load_tokenizer
from legorl.types import Status

pytestmark = pytest.mark.harness
try:
    require("mini-swe-agent")
except HarnessNotInstalled as e:  # scripts/setup_harnesses.sh installs it; CI runs that first
    pytest.skip(f"mini-swe-agent not installed: {e}", allow_module_level=True)

FENCE = "```mswea_bash_command\n{}\n```"


def config(engine: dict[str, Any], **sandbox: Any) -> RunConfig:
    return RunConfig.model_validate(
        {
            "run": {"tasks": "quickstart-calc", "max_concurrent_rollouts": 8},
            "calc_tasks": {"train": 16, "heldout": 4},
            "engine": {"model": "quickstart-qwen3", **engine},
            "proxy": {"temperature": 1.0, "max_tokens": 256, "max_context": 2048},
            "sandbox": {"retries": 0, **sandbox},
            "harness": {"name": "mini-swe-agent-warm", "max_turns": 4, "options": {"config": "quickstart"}},
            "trainer": {"model": "quickstart-qwen3"},
        }
    )


async def run(cfg: RunConfig, n: int = 1) -> list[Any]:
    tasks = load_task_split(cfg, "train")[:n]
    engine = make_engine(cfg.engine, load_tokenizer("quickstart-qwen3"))
    try:
        async with RolloutWorker(cfg, engine) as w:
            return list(await asyncio.gather(*(w.rollout(t) for t in tasks)))
    finally:
        await engine.close()


async def test_expert_resolves_through_the_warm_harness() -> None:
    recs = await run(config({"kind": "quickstart-expert", "options": {"p_read": 1.0}}), n=4)
    for rec in recs:
        o = rec.trajectory.outcome
        assert o.status is Status.RESOLVED and o.reward == 1.0, o
        assert rec.result.harness == "mini-swe-agent-warm"
        assert len(rec.turns) == 2 and rec.trajectory.stats.segments == 1  # test, then fix + submit
        seen = rec.turns[1].prompt_ids
        text = load_tokenizer("quickstart-qwen3").decode(seen)
        assert "<returncode>1</returncode>" in text and "FAIL " in text  # the sandbox's test output
        assert o.evidence["diff"].startswith("diff --git a/calc.py b/calc.py")


async def test_commands_run_in_the_sandbox_not_on_the_host(tmp_path: Path) -> None:
    marker = f"/tmp/legorl-host-{uuid.uuid4().hex}"
    cmd = f"touch {marker} && ls / > seen.txt && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    cfg = config({"kind": "scripted", "scripted_completions": [FENCE.format(cmd)]})
    rec = (await run(cfg))[0]
    assert not os.path.exists(marker)  # touched inside the sandbox only
    diff = rec.trajectory.outcome.evidence["diff"]
    assert "seen.txt" in diff and "+repo" in diff  # the sandbox's own root, with its /repo
    assert rec.trajectory.outcome.status is Status.FAILED  # graded: the bug is still there


async def test_command_timeout_and_agent_timeout() -> None:
    cfg = config(
        {"kind": "scripted", "scripted_completions": [FENCE.format("echo started; sleep 120")]}, agent_timeout_s=15
    )  # long enough for the first model call on a loaded machine: a timeout before it is ours, not the agent's
    rec = (await run(cfg))[0]
    assert rec.trajectory.outcome.status is Status.AGENT_TIMEOUT and not rec.trajectory.outcome.masked
    cfg.harness.options["command_timeout_s"] = 1
    cfg.sandbox.agent_timeout_s = 60
    rec = (await run(cfg))[0]
    assert rec.trajectory.outcome.status is Status.MAX_TURNS  # every command timed out; 4 turns used
    text = load_tokenizer("quickstart-qwen3").decode(rec.turns[1].prompt_ids)
    assert "timed out after 1 seconds" in text and "started" in text  # mini-swe-agent's own wording


async def test_a_killed_driver_is_infrastructure_and_the_next_rollout_recovers() -> None:
    cfg = config({"kind": "scripted", "scripted_completions": [FENCE.format("sleep 20")]})
    tasks = load_task_split(cfg, "train")[:1]
    engine = make_engine(cfg.engine, load_tokenizer("quickstart-qwen3"))
    try:
        async with RolloutWorker(cfg, engine) as w:
            pending = asyncio.create_task(w.rollout(tasks[0]))
            await asyncio.sleep(2.0)
            os.killpg(w.harness.driver.proc.pid, signal.SIGKILL)
            rec = await asyncio.wait_for(pending, 60)
            assert rec.trajectory.outcome.status is Status.INFRA_ERROR and rec.trajectory.outcome.masked
            w.harness.command_timeout_s = 1
            again = await asyncio.wait_for(w.rollout(tasks[0]), 120)
            assert again.trajectory.outcome.status is Status.MAX_TURNS  # a fresh driver ran it
    finally:
        await engine.close()


async def test_a_dead_drivers_rollout_says_how_it_died() -> None:
    """The masked rollout of a driver killed from outside carries its own flag and the
    signal in its evidence, not only the tail of the driver's log."""
    cfg = config({"kind": "scripted", "scripted_completions": [FENCE.format("sleep 20")]})
    tasks = load_task_split(cfg, "train")[:1]
    engine = make_engine(cfg.engine, load_tokenizer("quickstart-qwen3"))
    try:
        async with RolloutWorker(cfg, engine) as w:
            pending = asyncio.create_task(w.rollout(tasks[0]))
            while not w.harness.driver.in_flight:  # the agent's `sleep 20` runs in the sandbox
                await asyncio.sleep(0.05)
            os.killpg(w.harness.driver.proc.pid, signal.SIGKILL)
            o = (await asyncio.wait_for(pending, 60)).trajectory.outcome
    finally:
        await engine.close()
    assert o.status is Status.INFRA_ERROR and o.masked and o.flags == ["warm_driver_died"], o
    assert o.evidence["cause"] == "warm_driver_died"
    assert o.evidence["driver_exit"] == "killed by signal 9 (SIGKILL)", o.evidence
    assert "driver killed by signal 9 (SIGKILL)" in o.evidence["errors"][0]
