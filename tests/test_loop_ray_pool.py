"""RayRolloutPool's own logic, without starting a cluster (tests/test_loop_ray.py runs a real one):
least-loaded dispatch, the policy version each rollout carries, and a worker process that
dies becoming a masked infra_error whose record survives pickling (Ray ships records by
pickle). The actor handles here only mimic `handle.rollout.remote(...)` returning an
awaitable, which is all the pool uses of them."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Awaitable, Callable
from typing import Any

from ray.exceptions import RayActorError

from legorl.loop.config import RunConfig
from legorl.loop.ray_backend import RayRolloutPool
from legorl.loop.worker import RolloutRecord
from legorl.rollout import RolloutResult
from legorl.tasks.loader import load_shipped
from legorl.trajectory import assemble
from legorl.types import Outcome, Status

TASK = load_shipped("train")[0]


class Method:
    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self.fn(*args)


class Actor:
    """Records what it was sent; `dies` makes every call fail as a lost actor process does."""

    def __init__(self, dies: bool = False) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self.dies = dies
        self.rollout = Method(self._rollout)

    async def _rollout(self, task: Any, step: int, sid: str, version: int | None) -> RolloutRecord:
        self.calls.append((sid, version))
        await asyncio.sleep(0.05)
        if self.dies:
            raise RayActorError(error_msg="The actor died unexpectedly before finishing this task.")
        out = Outcome(1.0, Status.RESOLVED)
        traj = assemble([], sid)
        traj.outcome = out
        return RolloutRecord(traj, [], RolloutResult(task.instance_id, "command", out))


def pool(actors: list[Actor], version: int = 3) -> RayRolloutPool:
    cfg = RunConfig.model_validate({"harness": {"name": "command", "command_file": "/bin/true"}})
    p = RayRolloutPool(cfg, "http://127.0.0.1:9", policy_version=lambda: version)
    p.actors, p.inflight = actors, [0] * len(actors)  # what __aenter__ sets up on a cluster
    return p


async def test_rollouts_spread_least_loaded_and_carry_the_version() -> None:
    actors = [Actor(), Actor(), Actor()]
    p = pool(actors, version=3)
    records = await p.group(TASK, 6, step=2, limit=asyncio.Semaphore(6))
    assert [len(a.calls) for a in actors] == [2, 2, 2]
    for i, a in enumerate(actors):
        assert all(f"-w{i}-" in sid and sid.startswith(f"s2-{TASK.instance_id}-") for sid, _ in a.calls)
        assert {v for _, v in a.calls} == {3}
    assert len({r.trajectory.session_id for r in records}) == 6 and p.inflight == [0, 0, 0]


async def test_a_dead_worker_gives_masked_infra_errors_that_pickle() -> None:
    p = pool([Actor(dies=True), Actor()])
    records = await p.group(TASK, 4, step=0, limit=asyncio.Semaphore(4))
    lost = [r for r in records if r.trajectory.outcome.status == Status.INFRA_ERROR]
    assert len(lost) == 2 and p.inflight == [0, 0]
    for r in lost:
        o = r.trajectory.outcome
        assert o.masked and o.reward == 0.0 and o.evidence["cause"] == "rollout_worker_died"
        assert "died unexpectedly" in o.evidence["error"]
        assert r.trajectory.instance_id == TASK.instance_id and r.turns == []
        back = pickle.loads(pickle.dumps(r))
        assert back.trajectory.outcome.status == Status.INFRA_ERROR and back.result.outcome.masked
