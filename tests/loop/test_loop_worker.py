"""A rollout whose engine fails is retried in a fresh sandbox and a fresh proxy session:
the failed attempt's turns never join the trajectory that is rewarded."""

from __future__ import annotations

from pathlib import Path

from legorl.loop.config import RunConfig
from legorl.loop.worker import RolloutWorker
from legorl.models import load_tokenizer
from legorl.tasks.loader import load_shipped
from legorl.types import Status
from tests.helpers.worker_util import AGENT, FailingFirst


async def _run(tmp_path: Path, failures: int, retries: int):
    (tmp_path / "agent.sh").write_text(AGENT)
    cfg = RunConfig.model_validate(
        {
            "harness": {"name": "command", "command_file": str(tmp_path / "agent.sh")},
            "sandbox": {"retries": retries, "agent_timeout_s": 120},
        }
    )
    engine = FailingFirst(failures, ["hello"], load_tokenizer("tiny-qwen3"))
    async with RolloutWorker(cfg, engine) as w:
        return await w.rollout(load_shipped("train")[0], session_id="sess")


async def test_engine_failure_is_retried_in_a_fresh_session(tmp_path: Path) -> None:
    rec = await _run(tmp_path, failures=1, retries=1)
    assert rec.trajectory.session_id == "sess-retry1"
    assert rec.trajectory.outcome.status is Status.NO_PATCH and not rec.trajectory.outcome.masked
    assert len(rec.turns) == 1 and all(t.session_id == "sess-retry1" for t in rec.turns)
    assert rec.trajectory.outcome.evidence["retried_after"] == ["sess: engine_error"]


async def test_persistent_engine_failure_is_masked_not_rewarded(tmp_path: Path) -> None:
    rec = await _run(tmp_path, failures=5, retries=1)
    o = rec.trajectory.outcome
    assert o.status is Status.INFRA_ERROR and o.masked and o.reward == 0.0
    assert o.evidence["cause"] == "engine_error"
