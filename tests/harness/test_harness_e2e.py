"""The four real harnesses, end to end, inside sandboxes, through the proxy.

Each runs its real binary/package from its read-only layer (scripts/setup_harnesses.sh)
inside an agent sandbox whose only way out is its proxy session; the production rollout
path (`RolloutWorker`: session → session socket → sandbox → diff → grading) does the rest.
- the oracle engine resolves two shipped tasks per harness (reward 1, every turn with ids
  and logprobs, the trajectory assembled, no side call left in it);
- each harness that compacts is made to (Claude Code and OpenCode by the proxy's honest
  "prompt too long" at a window placed inside the run, OpenHands by its condenser's size):
  the rollout still resolves, and the trajectory has >= 2 segments with no sampled token
  lost (mini-swe-agent never compacts);
- the tiny random `hf` model ends as an agent failure, never an infra error or a hang;
- once per harness on the docker backend;
- a dead engine (every call a 502) ends as a masked `infra_error`, not as a reward of 0;
- Claude Code and OpenCode run a real sub-agent (the oracle delegates the task through
  their `Agent` / `task` tool): the sub-agent's turns are their own segment beside the
  parent's unbroken chain,
  and every sampled token reaches the loss (delivered fraction 1.0).
"""

from __future__ import annotations

import asyncio

import pytest

from legorl.trajectory import delivered
from legorl.types import Status
from tests.helpers.harness_util import (
    BrokenEngine,
    Setup,
    check_recorded,
    docker_missing,
    harness_missing,
    prompt_window_between,
    rollouts,
    shipped,
    summary,
)

pytestmark = [pytest.mark.harness, pytest.mark.slow]
NATIVE = ["claude-code", "opencode", "openhands", "openhands-warm", "mini-swe-agent", "mini-swe-agent-warm"]
_calibration: dict[str, object] = {}  # harness -> a finished oracle rollout (prompt sizes per turn)


def _need(harness: str) -> None:
    why = harness_missing(harness)
    if why:
        pytest.fail(why)  # CI installs the layers; a missing one is a broken set-up, not a skip


def _assert_resolved(rec) -> None:  # noqa: ANN001
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.RESOLVED and o.reward == 1.0, summary(rec)
    check_recorded(rec)


@pytest.mark.parametrize("harness", NATIVE)
def test_oracle_resolves_two_shipped_tasks(harness: str) -> None:
    _need(harness)
    recs = asyncio.run(rollouts(Setup(harness), shipped(2)))
    assert len({r.trajectory.instance_id for r in recs}) == 2
    for rec in recs:
        _assert_resolved(rec)
        main = [t for t in rec.turns if not t.side_call]
        assert len(main) == 4, summary(rec)  # inspect, patch, test, finish
        assert rec.trajectory.side_turns == []  # no title call (OpenCode's --title), no summary
        if not harness.startswith("openhands"):  # OpenHands drops reasoning from history: a segment per turn
            assert len(rec.trajectory.segments) == 1, summary(rec)
    _calibration[harness] = recs[0]


@pytest.mark.parametrize("harness", ["claude-code", "opencode", "openhands", "openhands-warm"])
def test_compaction_keeps_every_sampled_token(harness: str) -> None:
    _need(harness)
    task = shipped(1)
    if harness.startswith("openhands"):  # its own setting: summarise once the history holds 6 events
        setup = Setup(harness, options={"condenser_max_size": 6, "condenser_keep_first": 1})
    else:  # the proxy's window ends between the end of turn 2 and the prompt of turn 3
        calib = _calibration.get(harness) or asyncio.run(rollouts(Setup(harness), task))[0]
        setup = Setup(harness, max_context=prompt_window_between(calib, 3))
    rec = asyncio.run(rollouts(setup, task))[0]
    _assert_resolved(rec)
    side = [t for t in rec.turns if t.side_call]
    assert side and all(t.completion_ids for t in side), summary(rec)  # the summary call, answered and marked
    assert len(rec.trajectory.segments) >= 2, summary(rec)
    if harness == "claude-code":
        assert rec.result.agent.details.get("compactions") == "1", summary(rec)


@pytest.mark.parametrize("harness", NATIVE)
def test_tiny_hf_model_fails_as_the_agent(harness: str) -> None:
    _need(harness)
    opts = {} if harness.startswith("openhands") else {"max_output_tokens": 48}
    setup = Setup(harness, engine="hf", max_turns=2, max_tokens=48, timeout_s=300, options=opts)
    rec = asyncio.run(rollouts(setup, shipped(1)))[0]
    o = rec.trajectory.outcome
    assert o is not None and not o.status.is_infra and not o.masked, summary(rec)
    assert o.status in (Status.NO_PATCH, Status.FAILED, Status.MAX_TURNS, Status.FORMAT_ERROR), summary(rec)
    assert o.reward == 0.0 and not rec.result.agent.timed_out
    assert rec.turns and all(len(t.logprobs) == len(t.completion_ids) for t in rec.turns)


@pytest.mark.docker
@pytest.mark.parametrize("harness", NATIVE)
def test_oracle_on_docker(harness: str) -> None:
    _need(harness)
    why = docker_missing()
    if why:
        pytest.fail(why)
    rec = asyncio.run(rollouts(Setup(harness, backend="docker"), shipped(1)))[0]
    _assert_resolved(rec)


@pytest.mark.parametrize("harness", ["claude-code", "mini-swe-agent"])
def test_dead_engine_is_an_infra_error(harness: str) -> None:
    """The proxy answers 502s: the harness gives up, and the rollout is masked, not scored."""
    _need(harness)
    engine = BrokenEngine()
    rec = asyncio.run(rollouts(Setup(harness, timeout_s=300), shipped(1), engine=engine))[0]
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.INFRA_ERROR and o.masked, summary(rec)
    assert engine.calls >= 1 and rec.trajectory.segments == []


@pytest.mark.parametrize("harness", ["claude-code", "opencode"])
def test_sub_agent_is_its_own_segment(harness: str) -> None:
    """The oracle delegates the task to the harness's sub-agent tool (Claude Code's
    `Agent`, OpenCode's `task`); the sub-agent does the four steps and reports back."""
    if why := harness_missing(harness):
        pytest.skip(why)
    options = {"tools": "Bash,Read,Edit,Write,Glob,Grep,Agent"} if harness == "claude-code" else {}
    setup = Setup(harness, engine_options={"delegate": True}, options=options)
    rec = asyncio.run(rollouts(setup, shipped(1)))[0]
    assert rec.trajectory.outcome.status == Status.RESOLVED, summary(rec)
    check_recorded(rec)
    last = max(t.index for t in rec.turns)
    segs = sorted((s.turn_indices for s in rec.trajectory.segments), key=len)
    assert len(segs) == 2, summary(rec)
    parent, child = segs  # the parent: its delegating call and its final answer
    assert parent == [0, last] and len(child) >= 3 and all(0 < i < last for i in child), segs
    assert delivered(rec.turns, rec.trajectory)["fraction"] == 1.0
