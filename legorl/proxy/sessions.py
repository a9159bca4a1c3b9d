"""Sessions: one per harness run, owning the turns recorded for it.

A session is addressed by a URL prefix (`/s/{id}/v1/...`) or by the API key the harness
sends (`Authorization: Bearer <id>` / `x-api-key: <id>`), so pointing a harness at the
proxy needs nothing but a base URL or a key.

Two modes:
- **managed** (rollouts): the rollout code opens a session before starting the harness and
  closes it after; a request for any other id is refused (401 by key, 404 by URL), so a
  stray or late harness can never write into someone else's trajectory.
- **standalone** (`legorl proxy`): an id is opened by its first *accepted* request (a
  refused one leaves nothing behind); after it was closed, the same id opens a fresh session
  (a user may reuse one key for many runs). A session idle for `session_idle_s` is closed.

Aborted calls (client gone, timeout, engine fault mid-answer) are recorded in
`turns.jsonl` with `finish_reason: abort` but kept out of the trajectory: the harness never
acted on them, so training on them would credit the policy with actions nobody took.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import orjson

from legorl.proxy.errors import ProxyError, bad_request
from legorl.proxy.limits import safe_dumps
from legorl.proxy.renderer import RenderState
from legorl.trajectory import assemble, extends
from legorl.types import Trajectory, Turn

log = logging.getLogger(__name__)


class Session:
    """One harness run's connection to the proxy."""

    def __init__(self, session_id: str, meta: dict[str, Any] | None = None, managed: bool = True) -> None:
        self.id = session_id
        self.meta: dict[str, Any] = dict(meta or {})
        self.managed = managed
        self.opened_at = time.time()
        self.last_active = time.monotonic()
        self.turns: list[Turn] = []  # delivered turns, in completion order
        self.aborted: list[Turn] = []
        self.state = RenderState()
        self.closed = False
        self.late_turns = 0  # turns that finished after the session was closed
        self.engine_errors = 0  # calls answered with a 5xx (engine failure, timeout, proxy bug): infra faults
        # requests refused because the prompt did not fit the window: the agent's doing, graded as
        # it stands, but named on the outcome (`context_exceeded`) so a harness whose prompt alone
        # overflows a small model is not read as a model that chose to stop
        self.context_errors = 0
        # failed calls the session brought on itself (its own concurrent load, a stream it did not
        # read, a request that broke the proxy), by cause: graded, never masked (`proxy/blame.py`)
        self.agent_faults: dict[str, int] = {}
        self.requests = 0  # model-call requests that reached this session, whatever became of them
        self.in_flight = 0  # model calls admitted and not yet finished
        self.admitted = 0  # model calls admitted so far
        self.closed_externally = False  # closed by a management call, not by its owner
        self._next = 0

    def next_index(self) -> int:
        i = self._next
        self._next += 1
        return i

    def sorted_turns(self) -> list[Turn]:
        return sorted(self.turns, key=lambda t: t.index)

    def summary(self) -> dict[str, Any]:
        return {
            "session": self.id,
            "managed": self.managed,
            "turns": len(self.turns),
            "aborted": len(self.aborted),
            "engine_errors": self.engine_errors,
            "context_errors": self.context_errors,
            "agent_faults": dict(self.agent_faults),
            "in_flight": self.in_flight,
            "requests": self.requests,
            "side_calls": sum(1 for t in self.turns if t.side_call),
            "opened_at": self.opened_at,
            "closed": self.closed,
        }


def trim_routing(session: Session, turn: Turn) -> None:
    """Drop the routing rows `turn` shares with its predecessor in the segment.

    Engines report routing for the whole prompt on every call, so an episode's routing
    would grow with turns x context (for a 40-layer top-8 MoE model, ~640 bytes per token
    per turn: gigabytes over a long episode). Only when `turn` extends the previous
    policy turn token-for-token — exactly when `assemble` will put both in one segment —
    are the rows that turn already covered dropped (`turn.routing_base` says how many).
    Only the immediately preceding policy turn counts, with every index in between known
    (a side call or an aborted call): a turn still in flight could come between them.
    """
    if turn.side_call or turn.routed_experts is None or turn.routing_base:
        return
    known = {t.index: t for t in session.turns}
    aborted = {t.index for t in session.aborted}
    prev = None
    for i in range(turn.index - 1, -1, -1):
        t = known.get(i)
        if t is not None and not t.side_call:
            prev = t
            break
        if t is None and i not in aborted:
            return  # unknown: in flight
    if prev is None or prev.routed_experts is None:
        return
    if not extends(turn.prompt_ids, prev.prompt_ids, prev.completion_ids):
        return
    base = min(prev.routing_base + len(prev.routed_experts), len(turn.routed_experts))
    if base > 0:
        turn.routed_experts = turn.routed_experts[base:].copy()  # a copy: the view would pin the whole
        turn.routing_base = base


def share_request(session: Session, turn: Turn) -> None:
    """Make `turn.request` reuse the previous policy turn's objects where they are equal.

    A harness resends its whole history each call, so the recorded bodies grow with
    turns x context (9.4 MB for a 50-turn, 67k-token episode; `bench/session_memory.py`),
    for every concurrent session. Top-level values equal
    to the previous body's (tools, system prompt) and, in lists, equal leading items
    (messages, input) become the very same objects: the session holds each message once.
    """
    if turn.side_call or not turn.request:
        return
    prev = next(
        (t for t in reversed(session.turns) if not t.side_call and t.request and t.dialect == turn.dialect), None
    )
    if prev is None:
        return
    for key, value in turn.request.items():
        old = prev.request.get(key)
        if old is None or old is value:
            continue
        if isinstance(value, list) and isinstance(old, list):
            for i in range(min(len(value), len(old))):
                if value[i] is not old[i] and value[i] != old[i]:
                    break
                value[i] = old[i]
        elif value == old:
            turn.request[key] = old


class JsonlRecorder:
    """Appends finished turns and closed sessions' trajectories as JSON lines.

    Each line is one unbuffered write, so a crash loses at most the line being written and
    a reader (UI, trainer) never sees half a record from this process."""

    def __init__(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self._turns = os.open(out_dir / "turns.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._trajs = os.open(out_dir / "trajectories.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def turn(self, turn: Turn) -> None:
        # orjson serialises the dataclass (and its StrEnums) natively: no asdict() deep copy.
        # safe_dumps: a record the encoder refuses is written with that part marked, never lost.
        line = safe_dumps(turn, orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY)
        os.write(self._turns, b'{"session":' + safe_dumps(turn.session_id) + b"," + line[1:])

    def trajectory(self, session: Session, traj: Trajectory) -> None:
        rec = {
            "session": session.id,
            "meta": session.meta,
            "turns": len(session.turns),
            "aborted_turns": len(session.aborted),
            "opened_at": session.opened_at,
            "closed_at": time.time(),
            "trajectory": traj,
        }
        os.write(self._trajs, safe_dumps(rec, orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY))

    def close(self) -> None:
        for fd in (self._turns, self._trajs):
            try:
                os.close(fd)
            except OSError:
                pass


class SessionRegistry:
    """Open sessions by id, in managed or standalone mode."""

    MAX_ID_CHARS = 256
    _MAX_CLOSED_IDS = 100_000  # remembered only to word the 'is closed' error

    def __init__(self, standalone: bool = False, recorder: JsonlRecorder | None = None, idle_s: float = 3600.0) -> None:
        self.standalone = standalone
        self.recorder = recorder
        self.idle_s = idle_s
        self.open_sessions: dict[str, Session] = {}
        self.closed_ids: dict[str, None] = {}  # insertion-ordered: the oldest are forgotten first
        self._next_sweep = time.monotonic() + min(60.0, idle_s)

    def open(self, session_id: str, meta: dict[str, Any] | None = None, managed: bool = True) -> Session:
        if not session_id or len(session_id) > 256:
            raise ValueError(f"session id must be 1..256 characters, got {session_id!r}")
        if session_id in self.open_sessions:
            raise ValueError(f"session {session_id!r} is already open")
        s = Session(session_id, meta, managed)
        self.open_sessions[session_id] = s
        self.closed_ids.pop(session_id, None)
        return s

    def resolve(self, session_id: str | None, from_url: bool) -> Session:
        """The open session a request belongs to, or the error to answer it with."""
        if not session_id:
            raise ProxyError(
                401,
                "no session: put the session id in the URL (/s/<id>/v1/...) or send it as the API key "
                "(Authorization: Bearer <id> or x-api-key: <id>)",
                "authentication",
            )
        if len(session_id) > self.MAX_ID_CHARS:
            raise bad_request(f"session id of {len(session_id)} characters: at most {self.MAX_ID_CHARS} are allowed")
        now = time.monotonic()
        if self.standalone and now >= self._next_sweep:
            self.sweep(now)
        s = self.open_sessions.get(session_id)
        if s is not None:
            s.last_active = now
            return s
        if self.standalone:
            return Session(session_id, managed=False)  # provisional: `adopt` opens it once accepted
        status, kind = (404, "not_found") if from_url else (401, "authentication")
        what = "is closed" if session_id in self.closed_ids else "is not open"
        raise ProxyError(status, f"session {session_id!r} {what} on this proxy", kind)

    def adopt(self, session: Session) -> Session:
        """The registered session for a (possibly provisional) `session` from `resolve`:
        a standalone session is opened here, by its first accepted request."""
        if session.managed or self.open_sessions.get(session.id) is session:
            return session
        existing = self.open_sessions.get(session.id)
        if existing is not None:  # a concurrent first request opened it meanwhile
            return existing
        self.open_sessions[session.id] = session
        self.closed_ids.pop(session.id, None)
        return session

    def sweep(self, now: float | None = None) -> list[Session]:
        """Close standalone sessions idle for `idle_s` (checked at most once a minute)."""
        now = time.monotonic() if now is None else now
        if now < self._next_sweep:
            return []
        self._next_sweep = now + min(60.0, self.idle_s)
        idle = [sid for sid, s in self.open_sessions.items() if not s.managed and now - s.last_active > self.idle_s]
        closed = [self.close(sid) for sid in idle]
        for s in closed:
            log.info("closed standalone session %s after %.0f s idle (%d turns)", s.id, self.idle_s, len(s.turns))
        return closed

    def add_turn(self, session: Session, turn: Turn, delivered: bool) -> None:
        if delivered and not session.closed:
            trim_routing(session, turn)
            share_request(session, turn)
        if self.recorder is not None:
            self.recorder.turn(turn)
        session.last_active = time.monotonic()
        if session.closed:
            session.late_turns += 1
            log.warning("session %s: turn %d finished after the session was closed", session.id, turn.index)
            return
        (session.turns if delivered else session.aborted).append(turn)

    def close(self, session_id: str) -> Session:
        """Close a session; its trajectory goes to the recorder (when there is one)."""
        s = self.open_sessions.pop(session_id, None)
        if s is None:
            what = "was already closed" if session_id in self.closed_ids else "is not open"
            raise KeyError(f"session {session_id!r} {what}")
        s.closed = True
        self.closed_ids[session_id] = None
        if len(self.closed_ids) > self._MAX_CLOSED_IDS:
            del self.closed_ids[next(iter(self.closed_ids))]
        if self.recorder is not None:
            self.recorder.trajectory(s, assemble(s.sorted_turns(), s.id))
        return s

    def close_all(self) -> list[Session]:
        return [self.close(sid) for sid in list(self.open_sessions)]
