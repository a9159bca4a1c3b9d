"""RayRolloutPool's own logic, without starting a cluster (tests/loop/test_loop_ray.py and
test_loop_ray_cluster.py run real ones): least-loaded dispatch, the policy version each rollout
carries, a worker process that dies: its rollouts retried on a live worker, or masked
infra_errors whose record survives pickling (Ray ships records by pickle), and the dead worker
dispatched again once a probe reaches its restarted process. The actor handles here only mimic
`handle.rollout.remote(...)` returning an
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

    def __init__(self, dies: bool = False, restarts: bool = False) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self.dies = dies
        self.restarts = restarts  # a probe after its death reaches a restarted process
        self.rollout = Method(self._rollout)
        self.start = Method(self._start)

    async def _start(self) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        if not self.restarts:
            raise RayActorError(error_msg="The actor died and has no restarts left.")
        self.dies = False
        return {"index": 0, "node_id": "restarted"}

    async def _rollout(
        self, task: Any, step: int, sid: str, version: int | None, harness: str | None = None
    ) -> RolloutRecord:  # RolloutActor.rollout's signature
        self.calls.append((sid, version))
        await asyncio.sleep(0.05)
        if self.dies:
            raise RayActorError(error_msg="The actor died unexpectedly before finishing this task.")
        out = Outcome(1.0, Status.RESOLVED)
        traj = assemble([], sid, outcome=out)
        return RolloutRecord(traj, [], RolloutResult(task.instance_id, "command", out))


def pool(actors: list[Actor], version: int = 3, retries: int = 1) -> RayRolloutPool:
    cfg = RunConfig.model_validate(
        {"harness": {"name": "command", "command_file": "/bin/true"}, "ray": {"lost_rollout_retries": retries}}
    )
    p = RayRolloutPool(cfg, "http://127.0.0.1:9", policy_version=lambda: version)
    p.actors, p.inflight, p.info = actors, [0] * len(actors), [{}] * len(actors)  # what __aenter__ sets up
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


async def test_a_dead_workers_rollouts_rerun_on_a_live_one_once_each() -> None:
    dead, live = Actor(dies=True), Actor()
    p = pool([dead, live])
    records = await p.group(TASK, 4, step=0, limit=asyncio.Semaphore(4))
    assert p.lost == {0} and p.lost_rollouts == len(dead.calls) >= 1 and p.inflight == [0, 0]
    sids = [r.trajectory.session_id for r in records]
    assert len(set(sids)) == 4 and all("-w1-" in s for s in sids)  # all graded on the live worker
    assert sum(s.endswith("-r1") for s in sids) == len(dead.calls)  # the lost ones, once more each
    assert all(r.trajectory.outcome.status == Status.RESOLVED for r in records)
    more = await p.group(TASK, 2, step=1, limit=asyncio.Semaphore(2))  # the dead worker gets no more
    assert len(dead.calls) == p.lost_rollouts and all("-w1-" in r.trajectory.session_id for r in more)


async def test_a_restarted_worker_is_dispatched_again() -> None:
    back, live = Actor(dies=True, restarts=True), Actor()
    p = pool([back, live])
    await p.group(TASK, 2, step=0, limit=asyncio.Semaphore(2))
    for _ in range(50):
        if not p.lost:
            break
        await asyncio.sleep(0.01)
    assert p.lost == set() and p.info[0] == {"index": 0, "node_id": "restarted"}
    n = len(back.calls)
    await p.group(TASK, 4, step=1, limit=asyncio.Semaphore(4))
    assert len(back.calls) == n + 2


async def test_without_retries_or_live_workers_lost_rollouts_are_masked_infra_errors_that_pickle() -> None:
    for p, masked in (
        (pool([Actor(dies=True), Actor()], retries=0), 2),
        (pool([Actor(dies=True), Actor(dies=True)]), 4),
    ):
        records = await p.group(TASK, 4, step=0, limit=asyncio.Semaphore(4))
        lost = [r for r in records if r.trajectory.outcome.status == Status.INFRA_ERROR]
        assert len(lost) == masked and p.inflight == [0, 0]
        for r in lost:
            o = r.trajectory.outcome
            assert o.masked and o.reward == 0.0 and o.evidence["cause"] == "rollout_worker_died"
            assert "died" in o.evidence["error"]
            assert r.trajectory.instance_id == TASK.instance_id and r.turns == []
            back = pickle.loads(pickle.dumps(r))
            assert back.trajectory.outcome.status == Status.INFRA_ERROR and back.result.outcome.masked
        assert len({r.trajectory.session_id for r in records}) == 4
