"""A rollout's record is built once: `Outcome` and `Trajectory` are frozen, and the worker
hands back a trajectory whose identity, outcome and evidence were all set when it was made."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from legorl.harness.base import AgentRun
from legorl.loop.config import RunConfig
from legorl.loop.record import RolloutAttempt, outcome_of
from legorl.loop.worker import RolloutWorker
from legorl.models import load_tokenizer
from legorl.rollout import HostLoopback, RolloutResult, SandboxSocket, run_rollout
from legorl.tasks.loader import load_shipped
from legorl.trajectory import assemble
from legorl.types import Outcome, Status
from tests.helpers.worker_util import AGENT, FailingFirst

EDITING_AGENT = AGENT + "echo '# touched by the agent' >> \"$(git ls-files '*.py' | head -n 1)\"\n"


def test_outcome_and_trajectory_are_frozen() -> None:
    outcome = Outcome(1.0, Status.RESOLVED)
    traj = assemble([], "s", instance_id="t", harness="command", step=2, outcome=outcome)
    assert (traj.instance_id, traj.harness, traj.step, traj.outcome) == ("t", "command", 2, outcome)
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.status = Status.FAILED  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        traj.outcome = Outcome(0.0, Status.FAILED)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        traj.instance_id = "other"  # type: ignore[misc]


def test_engine_errors_override_an_agent_verdict_in_the_one_outcome() -> None:
    verdict = Outcome(1.0, Status.RESOLVED, flags=["f"], tests={"t": "passed"}, evidence={"diff": "own"})
    result = RolloutResult("i", "command", verdict, diff="d", agent=AgentRun(0, details={"command_s": "1.5"}))
    result = dataclasses.replace(result, timings={"agent_s": 2.0})
    attempt = RolloutAttempt("s", result, [], engine_errors=2)
    assert attempt.infra_cause == "engine_error"
    out = outcome_of(attempt, ["s0: engine_error"])
    assert (out.reward, out.status, out.masked, out.flags, out.tests) == (0.0, Status.INFRA_ERROR, True, ["f"], {})
    assert out.evidence["cause"] == "engine_error" and out.evidence["engine_errors"] == 2
    assert out.evidence["diff"] == "own"  # the verdict's own evidence wins over the attempt's diff
    assert out.evidence["timings"] == {"agent_s": 2.0, "command_s": 1.5}
    assert out.evidence["retried_after"] == ["s0: engine_error"]
    assert verdict.evidence == {"diff": "own"} and verdict.status is Status.RESOLVED  # the verdict is untouched
    clean = outcome_of(RolloutAttempt("s", result, [], engine_errors=0), [])
    assert clean.status is Status.RESOLVED and clean.tests == {"t": "passed"} and "retried_after" not in clean.evidence


async def test_proxy_access_must_match_where_the_harness_runs() -> None:
    from legorl.harness.command import CommandHarness

    task = load_shipped("train")[0]
    with pytest.raises(ValueError, match="SandboxSocket"):
        await run_rollout(task, CommandHarness("true"), None, "img", proxy=HostLoopback("http://127.0.0.1:1"))  # type: ignore[arg-type]
    assert SandboxSocket("/tmp/x.sock") == SandboxSocket("/tmp/x.sock")


async def _worker_rollout(tmp_path: Path, agent: str, failures: int, retries: int):
    (tmp_path / "agent.sh").write_text(agent)
    cfg = RunConfig.model_validate(
        {
            "harness": {"name": "command", "command_file": str(tmp_path / "agent.sh")},
            "sandbox": {"retries": retries, "agent_timeout_s": 120},
        }
    )
    engine = FailingFirst(failures, ["hello"], load_tokenizer("tiny-qwen3"))
    task = load_shipped("train")[0]
    async with RolloutWorker(cfg, engine) as w:
        return task, await w.rollout(task, step=3, session_id="sess")


async def test_a_worker_rollout_comes_back_with_every_field_set(tmp_path: Path) -> None:
    task, rec = await _worker_rollout(tmp_path, EDITING_AGENT, failures=0, retries=0)
    traj = rec.trajectory
    assert (traj.session_id, traj.instance_id, traj.harness, traj.step) == ("sess", task.instance_id, "command", 3)
    o = traj.outcome
    assert o is not None and o is rec.result.outcome  # one record: the result carries the same outcome
    assert o.status in (Status.FAILED, Status.RESOLVED), o
    assert "touched by the agent" in o.evidence["diff"] and o.evidence["diff"] == rec.result.diff
    assert {"agent_s", "harness_s", "grade_s"} <= set(o.evidence["timings"]), o.evidence["timings"]
    assert o.evidence["agent_exit_code"] == 0 and "retried_after" not in o.evidence
    assert len(traj.segments) == 1 and len(rec.turns) == 1


async def test_an_engine_error_retried_then_masked_keeps_its_evidence(tmp_path: Path) -> None:
    _, rec = await _worker_rollout(tmp_path, AGENT, failures=2, retries=1)
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.INFRA_ERROR and o.masked and o.reward == 0.0
    assert o.evidence["cause"] == "engine_error" and o.evidence["engine_errors"] == 1
    assert o.evidence["retried_after"] == ["sess: engine_error"]
    assert o.evidence["diff"] == "" and "agent_s" in o.evidence["timings"]
    assert rec.trajectory.session_id == "sess-retry1" and rec.trajectory.step == 3
