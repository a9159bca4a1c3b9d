"""The record of one rollout, built once: its final `Outcome` and its `Trajectory`.

Each stage of a rollout returns its decision and amends nothing: the agent stage its run
and diff, the grade stage its verdict (`rollout.run_rollout`'s outcome), the proxy session
its engine-error count, the worker's retry loop the attempts it gave up on. This module is
the one place those decisions become the record the trainer, the run store and the
monitors read; `Outcome` and `Trajectory` are frozen, so nothing is stamped on after.

An engine failure during the run is the infrastructure's fault even when the harness
merely reports "API error" and exits: a non-zero engine-error count makes the record
`infra_error` (cause `engine_error`, retried, then masked), never a reward of 0. A prompt the
proxy refused as over the model's window is the agent's (its conversation grew, or its own
system prompt does not fit a small model): graded as it stands, flagged `context_exceeded`.
The engine-error count holds only faults the proxy could prove are ours (`proxy/blame.py`);
failures the session brought on itself (its own concurrent load, a stream it did not read, a
call past its concurrency limit) are the agent's: graded as they stand, flagged
`agent_faults`, never masked, so no agent can escape its zero by making our side look faulty.
A session closed from outside its rollout (a management call) is ours: `session_closed`.
A harness that ran out its time before one model call reached its session is ours as well
(`timed_out_before_first_call`): the policy was never asked anything, so nothing it did can
have spent that time; a first call still unanswered at the limit is the agent's timeout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from legorl.rollout import RolloutResult
from legorl.trajectory import SIDE_CALLS_DEFAULT, SideCalls, assemble
from legorl.types import Outcome, Status, Task, Trajectory, Turn

CONTEXT_FLAG = "context_exceeded"  # the harness's prompt reached the model's window (the proxy refused it)
SILENT_EXIT_FLAG = "exited_before_first_call"  # the harness failed before it asked the model anything
AGENT_FAULTS_FLAG = "agent_faults"  # failed calls the session brought on itself (proxy/blame.py): graded
SESSION_CLOSED = "session_closed"  # the proxy session was closed from outside while the rollout ran
# timed out before one model call reached its session: the policy was never asked anything, so
# the time went to the harness's start or to a request lost on its way (ours: retried, masked)
NO_FIRST_CALL = "timed_out_before_first_call"
HINT_CHARS = 800


@dataclass(frozen=True)
class RolloutRecord:
    """What one rollout produced: the trajectory (with outcome) and the raw turns."""

    trajectory: Trajectory
    turns: list[Turn]
    result: RolloutResult
    timings: dict[str, float] = field(default_factory=dict)
    aborted_tokens: int = 0  # sampled in calls that never reached the harness (the token ledger's `aborted`)
    retried_tokens: int = 0  # sampled in the attempts retried for an infrastructure fault (its `infra_mask`)


@dataclass(frozen=True)
class RolloutAttempt:
    """One attempt's decisions, before any record is built from them."""

    session_id: str
    result: RolloutResult  # the agent run, the diff, the attempt's verdict and its timings
    turns: list[Turn]  # what the proxy session recorded
    engine_errors: int  # engine failures the session saw (0 for a relayed external endpoint)
    context_errors: int = 0  # requests refused as over the context window (the agent's; graded)
    agent_faults: dict[str, int] = field(default_factory=dict)  # failed calls by agent-side cause (graded)
    closed_externally: bool = False  # its session was closed by someone else mid-rollout (ours)
    aborted_tokens: int = 0  # completion tokens of its aborted calls (never in the trajectory)
    requests: int | None = None  # model calls that reached its session (None: relayed to an external endpoint)

    @property
    def sampled_tokens(self) -> int:
        """Every completion token the policy sampled in this attempt, aborted calls included."""
        return sum(len(t.completion_ids) for t in self.turns) + self.aborted_tokens

    @property
    def infra_cause(self) -> str | None:
        """Why this attempt is the infrastructure's fault (to retry), None when it is not."""
        o = self.result.outcome
        if o.status.is_infra:
            return str(o.evidence.get("cause", o.status.value))
        if self.closed_externally:
            return SESSION_CLOSED
        if o.status is Status.AGENT_TIMEOUT and self.requests == 0:
            return NO_FIRST_CALL
        return "engine_error" if self.engine_errors else None

    @property
    def timings(self) -> dict[str, float]:
        """The rollout's stage timings, plus a host harness's own command time."""
        timings = dict(self.result.timings)
        agent = self.result.agent
        if agent is not None and "command_s" in agent.details:  # a HostHarness's commands
            timings["command_s"] = float(agent.details["command_s"])
        return timings


def asked_the_policy(attempt: RolloutAttempt) -> bool:
    """Whether the attempt recorded a turn of the policy's own (side calls aside)."""
    return any(not t.side_call for t in attempt.turns)


def silent_exit(attempt: RolloutAttempt) -> str | None:
    """The harness's last words when it failed before its first model call (exit status not 0,
    no turn recorded, no context refusal to explain it): a `no_patch` alone would not say why."""
    run = attempt.result.agent
    if run is None or run.exit_code == 0 or run.timed_out or attempt.context_errors:
        return None
    if asked_the_policy(attempt):
        return None
    tail = (run.stderr_tail or run.stdout_tail).strip()
    return tail[-HINT_CHARS:] or f"exit status {run.exit_code}, no output"


def stalled_before_first_call(attempt: RolloutAttempt) -> str | None:
    """The harness's last output when it ran out its time before its first model call: whether it
    started at all and what it last said, so a bare `agent_timeout` shows a startup that never
    finished apart from a first request that got no answer."""
    run = attempt.result.agent
    if run is None or not run.timed_out or asked_the_policy(attempt):
        return None
    said = [(n, t.strip()) for n, t in (("stderr", run.stderr_tail), ("stdout", run.stdout_tail))]
    return "\n".join(f"{n}: {t[-HINT_CHARS:]}" for n, t in said if t) or "no output"


def outcome_of(attempt: RolloutAttempt, retried_after: list[str]) -> Outcome:
    """The final outcome of a rollout whose last attempt is `attempt`: its verdict (turned
    into `engine_error` when the engine failed under an agent-caused one), the diff and the
    timings as evidence (unless the verdict has its own), and the attempts retried before."""
    verdict = attempt.result.outcome
    evidence: dict[str, Any] = dict(verdict.evidence)
    ours = attempt.infra_cause if not verdict.status.is_infra else None
    if ours is not None:
        evidence.update(cause=ours)
        if attempt.engine_errors:
            evidence["engine_errors"] = attempt.engine_errors
        reward, status, masked, tests = 0.0, Status.INFRA_ERROR, True, {}
    else:
        reward, status, masked, tests = verdict.reward, verdict.status, verdict.masked, dict(verdict.tests)
    flags = list(verdict.flags)
    if ours == SESSION_CLOSED:
        flags.append(SESSION_CLOSED)
    if attempt.agent_faults:  # its own load or reading: graded as it stands, but named
        flags.append(AGENT_FAULTS_FLAG)
        evidence["agent_faults"] = dict(attempt.agent_faults)
    if attempt.context_errors:  # graded as it stands, but the table and the UI say why it stopped
        flags.append(CONTEXT_FLAG)
        evidence["context_errors"] = attempt.context_errors
    if (hint := silent_exit(attempt)) is not None:
        flags.append(SILENT_EXIT_FLAG)
        evidence["agent_output_tail"] = hint
    elif (stalled := stalled_before_first_call(attempt)) is not None:
        evidence["agent_output_tail"] = stalled
    evidence.setdefault("diff", attempt.result.diff)
    evidence.setdefault("timings", {k: round(v, 4) for k, v in attempt.timings.items()})
    if retried_after:
        evidence["retried_after"] = list(retried_after)
    return Outcome(reward, status, masked=masked, flags=flags, tests=tests, evidence=evidence)


def record_of(
    task: Task,
    step: int,
    attempt: RolloutAttempt,
    retried_after: list[str],
    side_calls: SideCalls = SIDE_CALLS_DEFAULT,
    *,
    retried_tokens: int = 0,
) -> RolloutRecord:
    """The rollout's record: its final outcome and trajectory, each constructed once
    (`side_calls`: the run's `[harness] side_calls`; `retried_tokens`: sampled in the attempts
    before it, given up on)."""
    outcome = outcome_of(attempt, retried_after)
    result = attempt.result
    traj = assemble(
        attempt.turns,
        attempt.session_id,
        instance_id=task.instance_id,
        harness=result.harness,
        step=step,
        outcome=outcome,
        side_calls=side_calls,
    )
    replaced = dataclasses.replace(result, outcome=outcome)
    return RolloutRecord(
        traj,
        attempt.turns,
        replaced,
        attempt.timings,
        aborted_tokens=attempt.aborted_tokens,
        retried_tokens=retried_tokens,
    )


def masked_record(task: Task, step: int, harness: str, session_id: str, outcome: Outcome) -> RolloutRecord:
    """The record of a rollout that never ran an agent (its task image cannot be built, its
    worker process died): no turns, the infrastructure `outcome`, masked."""
    traj = assemble([], session_id, instance_id=task.instance_id, harness=harness, step=step, outcome=outcome)
    return RolloutRecord(traj, [], RolloutResult(task.instance_id, harness, outcome))
