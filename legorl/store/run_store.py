"""The run store: every turn, trajectory, outcome, metric and alert of a run, in SQLite.

Design rule (docs/architecture.md): everything the UI shows comes from here, and the store is
written before anything is trained on, so a crash loses nothing that was recorded. Each
`add_*`/`set_*` call is one committed transaction when it returns; the writer can be
SIGKILLed at any point and every call that returned is readable afterwards. Calls made
inside `with store.transaction():` join one transaction instead: a rollout's record (its
session, turns, trajectory and outcome) is there whole or not at all, so a kill or a full
disk never leaves a trajectory with turns but no outcome.

Writers: one `RunStore` per process (the proxy, the loop, the trainer); calls are
thread-safe. Readers (the UI) open `RunStore(dir, readonly=True)`, which gives each
thread its own connection; WAL lets them read while training writes.

    store = RunStore(run_dir)
    store.start_session(sid, step=3, instance_id="astropy__astropy-12907", harness="claude_code")
    store.add_turn(turn, pieces=["def", " foo", ...])       # as the proxy records it
    store.add_trajectory(trajectory)                         # segments (+ outcome if graded)
    store.set_outcome(sid, outcome)                          # when grading finishes
    store.set_trainer_logprobs(sid, turn_index, logprobs)    # trainer recomputation
    store.set_advantage(sid, 0.42)
    store.log_metrics(step, {"reward/mean": 0.31})
    store.add_alert(step, "mismatch", "warning", "pearson 0.97 < 0.99")
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from legorl.harness.actions import ActionFormat
from legorl.store import codec
from legorl.store import messages as msgs
from legorl.store.phase_steps import HELDOUT_STEP, WARM_START_STEP, eval_phase
from legorl.store.queries import StoreQueries
from legorl.store.rebuild import TurnState, common_items, dumps, loads, rebuild_turns, state_of
from legorl.store.schema import OUTCOME_FTS_SLOT, TURN_ROW_BITS, connect, db_path, init_schema, readable
from legorl.types import Outcome, Trajectory, Turn

SEVERITIES = ("info", "warning", "critical")


class StoreListener(Protocol):
    """Told of each metric batch and alert once committed (`RunStore.attach`)."""

    def metrics(self, step: int, values: Mapping[str, float]) -> None: ...
    def alert(self, step: int, name: str, severity: str, message: str, value: float | None = None) -> None: ...


class RunStore(StoreQueries):
    """Read/write access to one run's `run.sqlite` (see the module docstring)."""

    def __init__(
        self,
        path: Path | str,
        *,
        readonly: bool = False,
        durable: bool = True,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        cache_sessions: int = 256,
    ) -> None:
        self.path = db_path(path)
        self.readonly = readonly
        if readonly and not self.path.exists():
            raise FileNotFoundError(f"no run store at {self.path} (is {path} a run directory?)")
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._local = threading.local()
        self._conn = connect(self.path, readonly=readonly, durable=durable)
        self._traj_ids: dict[str, int] = {}
        self._last_turn: OrderedDict[str, TurnState] = OrderedDict()
        self._cache_sessions = cache_sessions
        self._listeners: list[StoreListener] = []
        self._depth = 0  # nesting of `_write` (under the lock): >0 inside a transaction
        if not readonly:
            with self._lock, readable(self.path):
                init_schema(self._conn)
                if self._conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0:
                    self._conn.execute(
                        "INSERT INTO runs(name, created, config, info) VALUES (?, ?, ?, '{}')",
                        (run_name or self.path.parent.name, time.time(), dumps(dict(config or {}))),
                    )
                elif run_name is not None or config is not None:
                    self.set_run_info(name=run_name, config=config)

    def attach(self, listener: StoreListener) -> None:
        """Also hand every metric and alert this store records to `listener` (the trackers,
        legorl/monitor/sinks.py), after its commit. A listener must not block or raise."""
        self._listeners.append(listener)

    # ----------------------------------------------------------------- plumbing
    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A connection to read with: per-thread for readonly stores, the writer's otherwise."""
        if self.readonly:
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = connect(self.path, readonly=True)
            yield conn
        else:
            with self._lock:
                yield self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One committed transaction; taken IMMEDIATE so concurrent writers queue, not fail.
        Inside another one (`transaction()`), it joins that one."""
        if self.readonly:
            raise PermissionError(f"run store {self.path} was opened readonly")
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._conn
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield self._conn
                self._depth = 0
                self._conn.execute("COMMIT")
            except BaseException:
                self._depth = 0
                if self._conn.in_transaction:  # SQLite may have rolled it back itself (a full disk)
                    self._conn.execute("ROLLBACK")
                self._traj_ids.clear()  # it may name a trajectory row that was just rolled back
                self._last_turn.clear()  # or a turn
                raise

    @contextmanager
    def transaction(self) -> Iterator[RunStore]:
        """Every write inside is one transaction, committed at the end (rolled back on an
        error): e.g. one rollout's whole record. Other threads' writes wait for it."""
        with self._write():
            yield self

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _traj_id(self, conn: sqlite3.Connection, session_id: str) -> int:
        """The trajectory row of a session, created on first sight."""
        if not session_id:
            raise ValueError("session_id must be a non-empty string")
        tid = self._traj_ids.get(session_id)
        if tid is None:
            conn.execute(
                "INSERT OR IGNORE INTO trajectories(session_id, created, updated) VALUES (?, ?, ?)",
                (session_id, time.time(), time.time()),
            )
            tid = conn.execute("SELECT id FROM trajectories WHERE session_id=?", (session_id,)).fetchone()[0]
            self._traj_ids[session_id] = tid
        return tid

    def _touch(self, conn: sqlite3.Connection, tid: int, sets: str = "", args: Sequence[Any] = ()) -> None:
        """Update a trajectory row and bump its `rev` so live readers see the change."""
        rev = conn.execute("SELECT coalesce(max(rev), 0) + 1 FROM trajectories").fetchone()[0]
        extra = f", {sets}" if sets else ""
        conn.execute(f"UPDATE trajectories SET rev=?, updated=?{extra} WHERE id=?", (rev, time.time(), *args, tid))

    # ----------------------------------------------------------------- run + steps
    def set_run_info(
        self, *, name: str | None = None, config: Mapping[str, Any] | None = None, info: Mapping[str, Any] | None = None
    ) -> None:
        with self._write() as c:
            if name is not None:
                c.execute("UPDATE runs SET name=?", (name,))
            if config is not None:
                c.execute("UPDATE runs SET config=?", (dumps(dict(config)),))
            if info is not None:
                c.execute("UPDATE runs SET info=?", (dumps(dict(info)),))

    def set_action_formats(self, formats: Mapping[str, ActionFormat]) -> None:
        """Record how each harness of the run takes an action from a turn (run info
        `action_formats`, merged with what is there): the metrics and monitors read it back
        (`action_formats()`), so a harness that acts through text blocks is not judged by
        tool calls."""
        with self._write() as c:
            row = c.execute("SELECT info FROM runs ORDER BY id LIMIT 1").fetchone()
            info = loads(row[0], {}) if row else {}
            info["action_formats"] = {**info.get("action_formats", {}), **{k: f.to_dict() for k, f in formats.items()}}
            c.execute("UPDATE runs SET info=?", (dumps(info),))

    def begin_step(
        self, step: int, *, policy_version: int | None = None, info: Mapping[str, Any] | None = None
    ) -> None:
        with self._write() as c:
            c.execute(
                "INSERT INTO steps(step, policy_version, t_start, info) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(step) DO UPDATE SET policy_version=excluded.policy_version, info=excluded.info",
                (int(step), policy_version, time.time(), dumps(dict(info or {}))),
            )

    def abandon_steps(self, from_step: int) -> int:
        """`abandon_attempt(from_step)` with every phase before GSPO kept."""
        return self.abandon_attempt(from_step, heldout_kept=None)

    def abandon_attempt(
        self, from_step: int, *, heldout_kept: Collection[str] | None = (), warm_start: bool = False
    ) -> int:
        """An interrupted attempt that a resume re-runs, so that each rollout counts once:
        trajectories of GSPO steps >= `from_step`, of the held-out evaluations not in
        `heldout_kept` (phase names, `end`; None keeps them all) and, with `warm_start`, the
        warm start's demonstrations are kept but flagged `abandoned` and detached from their
        step (so they are never mixed with the re-run's, nor counted in its results); those
        steps' rows, their metrics and the redone evaluations' `heldout/<label>/…` metrics
        are cleared. Returns how many trajectories were abandoned."""
        step = int(from_step)
        with self._write() as c:
            ids = [r[0] for r in c.execute("SELECT id FROM trajectories WHERE step >= ?", (step,))]
            if heldout_kept is not None:
                ids += [
                    tid
                    for tid, sid in c.execute("SELECT id, session_id FROM trajectories WHERE step = ?", (HELDOUT_STEP,))
                    if eval_phase(sid) not in heldout_kept
                ]
                redone = [
                    k
                    for (k,) in c.execute("SELECT DISTINCT key FROM metrics WHERE key LIKE 'heldout/%'")
                    if k.split("/")[1].split("@")[0] not in heldout_kept
                ]
                c.executemany("DELETE FROM metrics WHERE key = ?", [(k,) for k in redone])
            if warm_start:
                ids += [r[0] for r in c.execute("SELECT id FROM trajectories WHERE step = ?", (WARM_START_STEP,))]
                c.execute("DELETE FROM metrics WHERE step = ?", (WARM_START_STEP,))
            for tid in ids:
                c.execute("INSERT OR IGNORE INTO flags(flag, traj_id) VALUES ('abandoned', ?)", (tid,))
                self._touch(c, tid, "step=NULL, n_flags=n_flags+1")
            c.execute("DELETE FROM steps WHERE step >= ?", (step,))
            c.execute("DELETE FROM metrics WHERE step >= ? AND key NOT LIKE 'heldout/%'", (step,))
        return len(ids)

    def end_step(self, step: int) -> None:
        """Close a step; also refreshes the query planner's statistics (bounded work, ~0.1 s at
        10k trajectories) so filtered UI queries pick the selective index as the run grows."""
        with self._write() as c:
            c.execute(
                "INSERT INTO steps(step, t_end) VALUES (?, ?) ON CONFLICT(step) DO UPDATE SET t_end=excluded.t_end",
                (int(step), time.time()),
            )
        with self._lock:
            self._conn.execute("PRAGMA analysis_limit=400")
            self._conn.execute("ANALYZE")

    # ----------------------------------------------------------------- sessions + turns
    def start_session(
        self, session_id: str, *, step: int | None = None, instance_id: str | None = None, harness: str | None = None
    ) -> None:
        """Say which step/task/harness a session belongs to before its turns arrive (optional)."""
        with self._write() as c:
            tid = self._traj_id(c, session_id)
            self._touch(
                c,
                tid,
                "step=coalesce(?, step), instance_id=coalesce(?, instance_id), harness=coalesce(?, harness)",
                (step, instance_id, harness),
            )

    def add_turn(self, turn: Turn | Mapping[str, Any], pieces: Sequence[str] | None = None) -> None:
        """Record one model call. `pieces[i]` is the decoded text of `completion_ids[i]`
        (optional: without it the UI shows token ids). A dict may carry `completion_pieces`."""
        if not isinstance(turn, Turn):
            d = dict(turn)
            pieces = pieces if pieces is not None else d.get("completion_pieces")
            turn = Turn.from_dict(d)
        if len(turn.logprobs) != len(turn.completion_ids):
            raise ValueError(
                f"turn {turn.session_id}#{turn.index}: {len(turn.logprobs)} logprobs "
                f"for {len(turn.completion_ids)} completion tokens"
            )
        if pieces is not None and len(pieces) != len(turn.completion_ids):
            raise ValueError(
                f"turn {turn.session_id}#{turn.index}: {len(pieces)} pieces "
                f"for {len(turn.completion_ids)} completion tokens"
            )
        if not 0 <= turn.index < OUTCOME_FTS_SLOT:
            raise ValueError(f"turn index must be within 0..{OUTCOME_FTS_SLOT - 1}, got {turn.index}")
        prompt = np.asarray(turn.prompt_ids, dtype=np.int32)
        completion = np.asarray(turn.completion_ids, dtype=np.int32)
        list_key, items, rest = msgs.split_request(turn.request)
        # encode (and so validate) everything before taking the write lock
        packed = (
            codec.pack_ids(completion),
            codec.pack_floats(turn.logprobs),
            codec.pack_routing(turn.routed_experts),
            codec.pack_text(dumps(list(pieces))) if pieces is not None else None,
        )
        with self._write() as c:
            tid = self._traj_id(c, turn.session_id)
            if c.execute("SELECT 1 FROM turns WHERE traj_id=? AND idx=?", (tid, turn.index)).fetchone():
                raise ValueError(f"turn {turn.session_id}#{turn.index} is already recorded")
            prev = self._previous(c, turn.session_id, tid, turn.index)
            base = codec.common_prefix_len(prompt, prev.context_ids) if prev else 0
            msg_base = common_items(items, prev.items) if prev and prev.list_key == list_key else 0
            rest_same = prev is not None and prev.rest == rest
            new_items = items[msg_base:]
            shown = ([] if rest_same else msgs.system_messages(rest)) + msgs.display_messages(new_items, turn.dialect)
            shown += msgs.completion_messages(turn.response_text, turn.tool_calls)
            c.execute(
                "INSERT INTO turns(traj_id, idx, dialect, finish_reason, policy_version, model, side_call, "
                "format_error, n_prompt, prompt_base, prompt_tail, n_completion, completion_ids, logprobs, "
                "routing, pieces, list_key, msg_base, new_items, request_rest, response_text, tool_calls, "
                "sampling_used, sampling_requested, t_start, t_first_token, t_end, routing_base) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    tid,
                    turn.index,
                    str(turn.dialect),
                    str(turn.finish_reason),
                    turn.policy_version,
                    turn.model,
                    int(turn.side_call),
                    int(turn.format_error),
                    len(prompt),
                    base,
                    codec.pack_ids(prompt[base:]),
                    len(completion),
                    *packed,
                    list_key,
                    msg_base,
                    codec.pack_text(dumps(new_items)),
                    None if rest_same else codec.pack_text(dumps(rest)),
                    turn.response_text,
                    dumps(turn.tool_calls),
                    dumps(turn.sampling_used),
                    dumps(turn.sampling_requested),
                    turn.t_start,
                    turn.t_first_token,
                    turn.t_end,
                    turn.routing_base,
                ),
            )
            c.execute(
                "INSERT INTO fts(rowid, text) VALUES (?, ?)",
                ((tid << TURN_ROW_BITS) | turn.index, msgs.search_text(shown)),
            )
            self._touch(c, tid, "n_turns=n_turns+1, completion_tokens=completion_tokens+?", (len(completion),))
        with self._lock:  # only after the commit: deltas must never refer to an unrecorded turn
            self._remember(
                turn.session_id, TurnState(turn.index, np.concatenate([prompt, completion]), items, list_key, rest)
            )

    def _remember(self, session_id: str, state: TurnState) -> None:
        self._last_turn[session_id] = state
        self._last_turn.move_to_end(session_id)
        while len(self._last_turn) > self._cache_sessions:
            self._last_turn.popitem(last=False)

    def _previous(self, c: sqlite3.Connection, session_id: str, tid: int, index: int) -> TurnState | None:
        """The turn just before `index` (what its deltas are relative to), if recorded."""
        state = self._last_turn.get(session_id)
        if state is not None and state.index == index - 1:
            return state
        if index == 0 or not c.execute("SELECT 1 FROM turns WHERE traj_id=? AND idx=?", (tid, index - 1)).fetchone():
            return None
        rows = c.execute("SELECT * FROM turns WHERE traj_id=? AND idx<? ORDER BY idx", (tid, index)).fetchall()
        return state_of(rebuild_turns(rows)[-1])

    # ----------------------------------------------------------------- trajectories + outcomes
    def add_trajectory(self, traj: Trajectory) -> None:
        """Record an assembled trajectory: its segments, alignment stats and (if set) outcome."""
        with self._write() as c:
            tid = self._traj_id(c, traj.session_id)
            c.execute("DELETE FROM segments WHERE traj_id=?", (tid,))
            for i, seg in enumerate(traj.segments):
                n = len(seg.token_ids)
                if not (len(seg.loss_mask) == len(seg.logprobs) == n):
                    raise ValueError(
                        f"trajectory {traj.session_id} segment {i}: token_ids/loss_mask/logprobs "
                        f"lengths differ ({n}, {len(seg.loss_mask)}, {len(seg.logprobs)})"
                    )
                c.execute(
                    "INSERT INTO segments(traj_id, idx, turn_indices, n_tokens, n_sampled, token_ids, loss_mask, "
                    "logprobs, policy_versions, routing) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (
                        tid,
                        i,
                        dumps(seg.turn_indices),
                        n,
                        int(sum(seg.loss_mask)),
                        codec.pack_ids(seg.token_ids),
                        codec.pack_ids(seg.loss_mask),
                        codec.pack_floats(seg.logprobs),
                        codec.pack_ids(seg.policy_versions),
                        codec.pack_routing(seg.routed_experts),
                    ),
                )
            self._touch(
                c,
                tid,
                "step=?, instance_id=coalesce(nullif(?, ''), instance_id), "
                "harness=coalesce(nullif(?, ''), harness), n_segments=?, stats=?, side_turns=?, assembled=1",
                (
                    traj.step,
                    traj.instance_id,
                    traj.harness,
                    len(traj.segments),
                    dumps(traj.stats),
                    dumps(traj.side_turns),
                ),
            )
            if traj.outcome is not None:
                self._write_outcome(c, tid, traj.outcome)

    def set_outcome(self, session_id: str, outcome: Outcome) -> None:
        """Record (or replace, after a regrade) how a session was judged."""
        with self._write() as c:
            self._write_outcome(c, self._traj_id(c, session_id), outcome)

    def _write_outcome(self, c: sqlite3.Connection, tid: int, outcome: Outcome) -> None:
        reward = float(outcome.reward)
        if not math.isfinite(reward):
            raise ValueError(f"outcome reward must be finite, got {outcome.reward!r}")
        status = str(outcome.status)
        c.execute(
            "INSERT OR REPLACE INTO outcomes(traj_id, reward, status, masked, flags, tests, evidence, t) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (
                tid,
                reward,
                status,
                int(outcome.masked),
                dumps(outcome.flags),
                dumps(outcome.tests),
                codec.pack_text(dumps(outcome.evidence)),
                time.time(),
            ),
        )
        c.execute("DELETE FROM flags WHERE traj_id=?", (tid,))
        c.executemany("INSERT OR IGNORE INTO flags(flag, traj_id) VALUES (?, ?)", [(f, tid) for f in outcome.flags])
        rowid = (tid << TURN_ROW_BITS) | OUTCOME_FTS_SLOT
        c.execute("DELETE FROM fts WHERE rowid=?", (rowid,))
        diff = outcome.evidence.get("diff") or outcome.evidence.get("patch") or ""
        c.execute("INSERT INTO fts(rowid, text) VALUES (?, ?)", (rowid, f"{status} {' '.join(outcome.flags)}\n{diff}"))
        self._touch(
            c, tid, "status=?, reward=?, masked=?, n_flags=?", (status, reward, int(outcome.masked), len(outcome.flags))
        )

    def set_advantage(self, session_id: str, advantage: float) -> None:
        self.set_advantages({session_id: advantage})

    def set_advantages(self, advantages: Mapping[str, float]) -> None:
        """Advantages of many sessions (one group, one step) in one transaction."""
        with self._write() as c:
            for sid, adv in advantages.items():
                self._touch(c, self._traj_id(c, sid), "advantage=?", (float(adv),))

    def set_trainer_logprobs(self, session_id: str, turn_index: int, logprobs: Sequence[float] | np.ndarray) -> None:
        """The trainer's recomputed logprobs of one turn's completion tokens (same length)."""
        with self._write() as c:
            tid = self._traj_id(c, session_id)
            self._set_turn_trainer_logprobs(c, tid, session_id, turn_index, np.asarray(logprobs, dtype=np.float32))
            self._touch(c, tid)

    def _set_turn_trainer_logprobs(
        self, c: sqlite3.Connection, tid: int, sid: str, index: int, logprobs_T: np.ndarray
    ) -> None:
        row = c.execute("SELECT n_completion FROM turns WHERE traj_id=? AND idx=?", (tid, index)).fetchone()
        if row is None:
            raise KeyError(f"no turn {sid}#{index} in the store")
        if row[0] != len(logprobs_T):
            raise ValueError(f"turn {sid}#{index} has {row[0]} completion tokens, got {len(logprobs_T)} logprobs")
        c.execute(
            "UPDATE turns SET trainer_logprobs=? WHERE traj_id=? AND idx=?", (codec.pack_floats(logprobs_T), tid, index)
        )

    def set_segment_trainer_logprobs(
        self, session_id: str, segment_index: int, logprobs_T: Sequence[float] | np.ndarray
    ) -> None:
        """Trainer logprobs over a whole segment (aligned with its token_ids); also split onto
        its turns, whose completions sit at token_ids[len(prompt):len(prompt)+len(completion)]."""
        lp_T = np.asarray(logprobs_T, dtype=np.float32)
        with self._write() as c:
            tid = self._traj_id(c, session_id)
            seg = c.execute(
                "SELECT n_tokens, turn_indices FROM segments WHERE traj_id=? AND idx=?", (tid, segment_index)
            ).fetchone()
            if seg is None:
                raise KeyError(f"no segment {session_id}/{segment_index} in the store")
            if seg[0] != len(lp_T):
                raise ValueError(f"segment {session_id}/{segment_index} has {seg[0]} tokens, got {len(lp_T)} logprobs")
            c.execute(
                "UPDATE segments SET trainer_logprobs=? WHERE traj_id=? AND idx=?",
                (codec.pack_floats(lp_T), tid, segment_index),
            )
            for index in loads(seg[1], []):
                t = c.execute(
                    "SELECT n_prompt, n_completion FROM turns WHERE traj_id=? AND idx=?", (tid, index)
                ).fetchone()
                if t is not None and t[0] + t[1] <= len(lp_T):
                    self._set_turn_trainer_logprobs(c, tid, session_id, index, lp_T[t[0] : t[0] + t[1]])
            self._touch(c, tid)

    # ----------------------------------------------------------------- metrics, alerts, events
    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Scalar metrics of one step (non-finite values are kept as NULL = missing)."""
        rows = []
        for key, value in metrics.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"metric keys must be non-empty strings, got {key!r}")
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"metric {key!r} must be a number, got {value!r}") from None
            rows.append((int(step), key, v if math.isfinite(v) else None, time.time()))
        with self._write() as c:
            c.executemany("INSERT INTO metrics(step, key, value, t) VALUES (?,?,?,?)", rows)
        for listener in self._listeners:
            listener.metrics(int(step), {k: v for _, k, v, _ in rows if v is not None})

    def add_alert(
        self,
        step: int,
        name: str,
        severity: str,
        message: str,
        *,
        value: float | None = None,
        threshold: float | None = None,
    ) -> None:
        if severity not in SEVERITIES:
            raise ValueError(f"alert severity must be one of {SEVERITIES}, got {severity!r}")
        with self._write() as c:
            c.execute(
                "INSERT INTO alerts(step, name, severity, message, value, threshold, t) VALUES (?,?,?,?,?,?,?)",
                (int(step), name, severity, message, value, threshold, time.time()),
            )
        for listener in self._listeners:
            listener.alert(int(step), name, severity, message, value)

    def add_event(self, kind: str, data: Mapping[str, Any] | None = None, *, step: int | None = None) -> None:
        """A free-form run event (checkpoint saved, weights synced, run stopped by a monitor...)."""
        with self._write() as c:
            c.execute(
                "INSERT INTO events(step, kind, data, t) VALUES (?,?,?,?)",
                (step, kind, dumps(dict(data or {})), time.time()),
            )
