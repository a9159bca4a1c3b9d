"""Whose fault a failed model call is: ours (the rollout is retried, then masked) or the agent's
(the rollout is graded as it stands).

Why this is its own module: a masked rollout leaves the loss and its group's statistics, so
an agent that can make our side *look* faulty escapes its zero. A policy trained long enough
learns every such door (issue 39: 96 concurrent long generations from one session got 504s,
and every 5xx was counted as an engine fault). So a failure counts as ours only when it is
provably not the session's own doing:

- the engine failed (a 502: it refused, crashed or went away) — its crash is ours;
- a lone call timed out while the engine gave it nothing: still queued, or stalled mid-answer
  (no token for half the timeout, at most `STALL_S`) — the session had no other call of its
  own in flight at any moment of this one, and we were not waiting for the client to read.

Everything else is the agent's, counted by cause on the session (`Session.agent_faults`)
and shown on the outcome as a flag, never masked:

- `concurrency_limit`: a call past `session_max_concurrency` is refused with a 429;
- `own_load`: a call timed out while the same session had other calls in flight;
- `slow_read`: the timer fired while the client was not reading its stream;
- `long_generation`: the timer fired while the engine was still giving tokens: the policy
  would not stop (a policy that learned to ramble into the timeout would escape otherwise);
- `proxy_internal`: a request that broke the proxy (logged loudly: a bug to fix, but one
  an agent could otherwise aim at to get masked).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from legorl.proxy.errors import ProxyError
from legorl.proxy.sessions import Session

CONCURRENCY_LIMIT = "concurrency_limit"
OWN_LOAD = "own_load"
SLOW_READ = "slow_read"
LONG_GENERATION = "long_generation"
STALL_S = 30.0  # no engine step for this long (or half the request timeout) is a stalled engine: ours
PROXY_INTERNAL = "proxy_internal"


@dataclass
class Ticket:
    """One admitted call's view of its session's own load."""

    session: Session
    serial: int  # the session's admission count when this call was admitted
    overlapped: bool  # another call of this session was in flight when this one was admitted
    released: bool = False

    def shared(self) -> bool:
        """Whether any other call of the same session overlapped this one in time."""
        return self.overlapped or self.session.admitted > self.serial

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.session.in_flight -= 1


def admit(session: Session, limit: int) -> Ticket:
    """Admit one call of `session`, or refuse it with a 429 when `limit` calls are in flight."""
    if session.in_flight >= limit:
        session.agent_faults[CONCURRENCY_LIMIT] = session.agent_faults.get(CONCURRENCY_LIMIT, 0) + 1
        raise ProxyError(
            429,
            f"too many concurrent requests in this session: {session.in_flight} are in flight and at most "
            f"{limit} are allowed (proxy setting `session_max_concurrency`); wait for one to finish",
            "rate_limit",
            code="session_concurrency_limit",
        )
    session.in_flight += 1
    session.admitted += 1
    return Ticket(session, session.admitted, overlapped=session.in_flight > 1)


def cause_of(
    err: ProxyError,
    ticket: Ticket | None,
    sending: bool,
    last_step_at: float | None = None,
    timeout_s: float = float("inf"),
) -> str | None:
    """The agent-side cause of a failed call, or None when the failure is ours (see the module
    docstring). `sending`: the failure came while we were blocked writing to the client;
    `last_step_at`: when the engine last gave this call a step (None: never)."""
    if err.status < 500:
        return None  # a 4xx is not a fault at all: neither counted as ours nor as the agent's
    if err.kind == "timeout":
        if sending:
            return SLOW_READ
        if ticket is not None and ticket.shared():
            return OWN_LOAD
        if last_step_at is not None and time.monotonic() - last_step_at < min(STALL_S, timeout_s / 2):
            return LONG_GENERATION
        return None
    if err.kind == "internal":
        return PROXY_INTERNAL
    return None  # the engine failed: ours


def charge(
    session: Session,
    err: ProxyError,
    ticket: Ticket | None,
    sending: bool,
    last_step_at: float | None = None,
    timeout_s: float = float("inf"),
) -> str | None:
    """Count a failed call on `session`, as ours (`engine_errors`) or as the agent's
    (`agent_faults[cause]`); returns the agent-side cause, None when ours or not a fault."""
    if err.status < 500:
        return None
    cause = cause_of(err, ticket, sending, last_step_at, timeout_s)
    if cause is None:
        session.engine_errors += 1
    else:
        session.agent_faults[cause] = session.agent_faults.get(cause, 0) + 1
    return cause
