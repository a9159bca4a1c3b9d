"""Read side of the run store: the queries behind the UI, the monitors and the exporters.

Kept apart from the writer so each file reads as one concept. `RunStore` inherits these
methods; they only need `self._read()` (a connection context) and return plain
JSON-ready dicts, except `load_turns`/`load_trajectory`, which rebuild the shared
dataclasses of `legorl.types` for code (the trainer, exporters) that wants them.

Listing is keyset-paginated on the trajectory id (newest first by default), so page N
costs the same as page 1 at any run size; every filter column has an index.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from legorl import ledger
from legorl.harness.actions import ActionFormat
from legorl.store import codec
from legorl.store import messages as msgs
from legorl.store.phase_steps import HELDOUT_STEP, WARM_START_STEP, phase_name
from legorl.store.rebuild import RebuiltTurn, loads, rebuild_turns
from legorl.store.schema import TURN_ROW_BITS
from legorl.types import (
    INFRA_STATUSES,
    AlignmentStats,
    Dialect,
    FinishReason,
    Outcome,
    Segment,
    Status,
    Trajectory,
    Turn,
    as_routing,
)

SUMMARY_COLS = (
    "t.id, t.session_id, t.step, t.instance_id, t.harness, t.status, t.reward, t.masked, t.n_flags, "
    "t.advantage, t.n_turns, t.n_segments, t.completion_tokens, t.assembled, t.created, t.updated, t.rev, "
    "o.flags AS flags"
)
FROM = "FROM trajectories t LEFT JOIN outcomes o ON o.traj_id = t.id"
SPECIAL_STATUSES = ("running", "infra")  # filters that are not a Status value
ZERO_VARIANCE_TOL = 1e-12  # legorl.train.advantages' (not imported: that module loads torch)


def fts_query(text: str) -> str:
    """User text → an FTS5 query that cannot be a syntax error: every word a quoted phrase, ANDed.
    A NUL ends a string for SQLite's FTS5 parser ("unterminated string"), so it separates words."""
    words = [w.replace('"', '""') for w in text.replace("\x00", " ").split()]
    return " ".join(f'"{w}"' for w in words)


def summary(row: sqlite3.Row) -> dict[str, Any]:
    d = dict(row)
    d["flags"] = loads(d.get("flags"), [])
    return d


def _rounded(arr: np.ndarray | None) -> list[float] | None:
    return None if arr is None else np.round(arr.astype(np.float64), 4).tolist()


class StoreQueries:
    """Read methods of `RunStore` (see the module docstring)."""

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:  # provided by RunStore
        raise TypeError("StoreQueries is a mixin of RunStore")

    # ----------------------------------------------------------------- run level
    def run_info(self) -> dict[str, Any]:
        with self._read() as c:
            run = c.execute("SELECT name, created, config, info FROM runs ORDER BY id LIMIT 1").fetchone()
            counts = dict(
                c.execute("SELECT coalesce(status, 'running'), count(*) FROM trajectories GROUP BY 1").fetchall()
            )
            harnesses = [r[0] for r in c.execute("SELECT DISTINCT harness FROM trajectories WHERE harness IS NOT NULL")]
            flags = [r[0] for r in c.execute("SELECT DISTINCT flag FROM flags")]
            steps = c.execute("SELECT min(step), max(step) FROM trajectories WHERE step >= 0").fetchone()
            phases = c.execute("SELECT step, count(*) FROM trajectories WHERE step < 0 GROUP BY step ORDER BY step")
            phases = [{"step": r[0], "name": phase_name(r[0]) or f"step {r[0]}", "trajectories": r[1]} for r in phases]
            last_metric = c.execute("SELECT max(step) FROM metrics").fetchone()[0]
            n_turns = c.execute("SELECT coalesce(sum(n_turns), 0) FROM trajectories").fetchone()[0]
        return {
            "name": run["name"] if run else "",
            "created": run["created"] if run else None,
            "config": loads(run["config"], {}) if run else {},
            "info": loads(run["info"], {}) if run else {},
            "trajectories": sum(counts.values()),
            "turns": n_turns,
            "status_counts": counts,
            "harnesses": sorted(harnesses),
            "flags": sorted(flags),
            "first_step": steps[0],  # GSPO steps only: the phases before them are `phases`
            "last_step": steps[1],
            "phases": phases,
            "last_metric_step": last_metric,
        }

    def action_formats(self) -> dict[str, ActionFormat]:
        """harness -> how it takes an action from a turn, as the run recorded it (empty for a
        store written before formats were recorded: every harness is then judged by tool calls)."""
        with self._read() as c:
            row = c.execute("SELECT info FROM runs ORDER BY id LIMIT 1").fetchone()
        recorded = loads(row["info"], {}).get("action_formats", {}) if row else {}
        return {name: ActionFormat.from_dict(d) for name, d in recorded.items()}

    def steps(self) -> list[dict[str, Any]]:
        with self._read() as c:
            rows = c.execute("SELECT step, policy_version, t_start, t_end, info FROM steps ORDER BY step").fetchall()
        return [{**dict(r), "info": loads(r["info"], {})} for r in rows]

    # ----------------------------------------------------------------- trajectory list
    def list_trajectories(
        self,
        *,
        status: str | None = None,
        harness: str | None = None,
        task: str | None = None,
        step: int | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        flag: str | None = None,
        q: str | None = None,
        cursor: int | None = None,
        limit: int = 50,
        order: str = "desc",
        with_total: bool = True,
    ) -> dict[str, Any]:
        """One page of trajectory summaries; pass the returned `next_cursor` for the next page.

        `status` is a Status value, "running" (not yet graded) or "infra" (any infra status);
        `flag` is a flag name or "any"; `q` is full-text search over turn text and diffs.
        """
        if order not in ("desc", "asc"):
            raise ValueError(f"order must be 'desc' or 'asc', got {order!r}")
        if not 1 <= limit <= 1000:
            raise ValueError(f"limit must be within 1..1000, got {limit}")
        where, args = [], []
        if status:
            if status == "running":
                where.append("t.status IS NULL")
            elif status == "infra":
                where.append(f"t.status IN ({','.join('?' * len(INFRA_STATUSES))})")
                args += sorted(INFRA_STATUSES)
            elif status in {s.value for s in Status}:
                where.append("t.status = ?")
                args.append(status)
            else:
                raise ValueError(
                    f"unknown status {status!r}; expected one of {[s.value for s in Status] + list(SPECIAL_STATUSES)}"
                )
        for col, val in (("harness", harness), ("instance_id", task), ("step", step)):
            if val is not None and val != "":
                where.append(f"t.{col} = ?")
                args.append(val)
        if min_reward is not None:
            where.append("t.reward >= ?")
            args.append(min_reward)
        if max_reward is not None:
            where.append("t.reward <= ?")
            args.append(max_reward)
        if flag == "any":
            where.append("t.n_flags > 0")
        elif flag:
            where.append("t.id IN (SELECT traj_id FROM flags WHERE flag = ?)")
            args.append(flag)
        if q and q.strip():
            where.append(f"t.id IN (SELECT rowid >> {TURN_ROW_BITS} FROM fts WHERE fts MATCH ?)")
            args.append(fts_query(q))
        filt = " AND ".join(where) or "1"
        page_where = filt + (f" AND t.id {'<' if order == 'desc' else '>'} ?" if cursor is not None else "")
        page_args = args + ([cursor] if cursor is not None else [])
        with self._read() as c:
            rows = c.execute(
                f"SELECT {SUMMARY_COLS} {FROM} WHERE {page_where} ORDER BY t.id {order} LIMIT ?",
                (*page_args, limit + 1),
            ).fetchall()
            total = (
                c.execute(f"SELECT count(*) FROM trajectories t WHERE {filt}", args).fetchone()[0]
                if with_total
                else None
            )
        items = [summary(r) for r in rows[:limit]]
        return {"items": items, "next_cursor": items[-1]["id"] if len(rows) > limit else None, "total": total}

    def changed_trajectories(self, since_rev: int, limit: int = 200) -> list[dict[str, Any]]:
        """Summaries of trajectory rows changed after `since_rev`, oldest change first (live updates)."""
        with self._read() as c:
            rows = c.execute(
                f"SELECT {SUMMARY_COLS} {FROM} WHERE t.rev > ? ORDER BY t.rev LIMIT ?", (since_rev, limit)
            ).fetchall()
        return [summary(r) for r in rows]

    def max_ids(self) -> dict[str, int]:
        """High-water marks the live stream starts from."""
        with self._read() as c:
            return {
                "rev": c.execute("SELECT coalesce(max(rev), 0) FROM trajectories").fetchone()[0],
                "metric": c.execute("SELECT coalesce(max(id), 0) FROM metrics").fetchone()[0],
                "alert": c.execute("SELECT coalesce(max(id), 0) FROM alerts").fetchone()[0],
                "event": c.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0],
            }

    # ----------------------------------------------------------------- one trajectory
    def _session_rows(self, c: sqlite3.Connection, session_id: str) -> tuple[sqlite3.Row | None, list[sqlite3.Row]]:
        head = c.execute(
            f"SELECT {SUMMARY_COLS}, t.stats, t.side_turns {FROM} WHERE t.session_id=?", (session_id,)
        ).fetchone()
        if head is None:
            return None, []
        return head, c.execute("SELECT * FROM turns WHERE traj_id=? ORDER BY idx", (head["id"],)).fetchall()

    def get_trajectory(self, session_id: str) -> dict[str, Any] | None:
        """Everything the trajectory page shows, or None if the session is unknown."""
        with self._read() as c:
            head, rows = self._session_rows(c, session_id)
            if head is None:
                return None
            orow = c.execute("SELECT * FROM outcomes WHERE traj_id=?", (head["id"],)).fetchone()
            segs = c.execute(
                "SELECT idx, turn_indices, n_tokens, n_sampled FROM segments WHERE traj_id=? ORDER BY idx",
                (head["id"],),
            ).fetchall()
        out = summary(head)
        out["stats"], out["side_turns"] = loads(head["stats"], {}), loads(head["side_turns"], [])
        out["segments"] = [{**dict(s), "turn_indices": loads(s["turn_indices"], [])} for s in segs]
        seg_of = {i: s["idx"] for s in out["segments"] for i in s["turn_indices"]}
        out["outcome"] = None
        if orow is not None:
            evidence = loads(codec.unpack_text(orow["evidence"]), {})
            out["outcome"] = {
                "reward": orow["reward"],
                "status": orow["status"],
                "masked": bool(orow["masked"]),
                "flags": loads(orow["flags"], []),
                "tests": loads(orow["tests"], {}),
                "diff": evidence.get("diff") or evidence.get("patch") or "",
                "evidence": {k: v for k, v in evidence.items() if k not in ("diff", "patch")},
            }
        out["turns"] = [self._turn_view(t, seg_of.get(t.row["idx"])) for t in rebuild_turns(rows)]
        out["phase"] = phase_name(out["step"])
        with self._read() as c:
            out["untrained"] = self._why_untrained(c, out)
        return out

    @staticmethod
    def _why_untrained(c: sqlite3.Connection, t: dict[str, Any]) -> str | None:
        """Why a trajectory has no advantage (None when it has one): a phase that is not
        GSPO, not graded yet, masked, its step still training, or a zero-variance group
        that the trainer skipped (`zero_variance_groups = "skip"`)."""
        if t["advantage"] is not None:
            return None
        step = t["step"]
        if step == HELDOUT_STEP:
            return "held-out evaluation: scored, never trained"
        if step == WARM_START_STEP:
            return "warm-start demonstration: imitated by SFT, no advantage"
        if step is None:
            return "abandoned: a resume re-ran its step or evaluation" if "abandoned" in t["flags"] else None
        if t["status"] is None:
            return "not graded yet"
        if t["masked"] or t["status"] in {s.value for s in INFRA_STATUSES}:
            return "masked (infrastructure failure): left out of its group, not trained"
        done = c.execute("SELECT t_end FROM steps WHERE step=?", (step,)).fetchone()
        if done is None or done[0] is None:
            return "its step is still running: no advantage yet"
        infra = sorted(s.value for s in INFRA_STATUSES)
        rewards = [
            r[0]
            for r in c.execute(
                "SELECT reward FROM trajectories WHERE step=? AND instance_id=? AND status IS NOT NULL AND masked=0 "
                f"AND status NOT IN ({','.join('?' * len(infra))})",
                (step, t["instance_id"], *infra),
            )
        ]
        if len(rewards) < 2 or max(rewards) - min(rewards) <= ZERO_VARIANCE_TOL:
            n = len(rewards)
            why = f"all {n} graded rollouts scored {rewards[0]:g}" if n > 1 else "one graded rollout"
            return f"group skipped: zero variance ({why}), not trained"
        return "not trained in its step (older than run.max_staleness: dropped)"

    @staticmethod
    def _turn_view(t: RebuiltTurn, segment: int | None) -> dict[str, Any]:
        r = t.row
        new_items = t.items[t.msg_base :]
        shown = msgs.display_messages(new_items, r["dialect"])
        if r["request_rest"] is not None:  # system prompt / tools changed (always on the first turn)
            shown = msgs.system_messages(t.rest) + shown
        trainer = codec.unpack_floats(r["trainer_logprobs"]) if r["trainer_logprobs"] else None
        return {
            "index": r["idx"],
            "segment": segment,
            "dialect": r["dialect"],
            "finish_reason": r["finish_reason"],
            "policy_version": r["policy_version"],
            "model": r["model"],
            "side_call": bool(r["side_call"]),
            "format_error": bool(r["format_error"]),
            "n_prompt": r["n_prompt"],
            "reused_prompt_tokens": r["prompt_base"],
            "n_completion": r["n_completion"],
            "earlier_messages": t.msg_base,
            "n_messages": len(t.items),
            "messages": shown,
            "tools": [
                x.get("name") or x.get("function", {}).get("name")
                for x in t.rest.get("tools", [])
                if isinstance(x, dict)
            ],
            "completion": msgs.completion_messages(r["response_text"] or "", loads(r["tool_calls"], [])),
            "completion_ids": t.completion_ids.tolist(),
            "pieces": loads(codec.unpack_text(r["pieces"]), None) if r["pieces"] else None,
            "logprobs": _rounded(codec.unpack_floats(r["logprobs"])),
            "trainer_logprobs": _rounded(trainer),
            "has_routing": r["routing"] is not None,
            "sampling_used": loads(r["sampling_used"], {}),
            "t_start": r["t_start"],
            "t_first_token": r["t_first_token"],
            "t_end": r["t_end"],
        }

    def get_turn_request(self, session_id: str, index: int) -> dict[str, Any] | None:
        """The full raw request of one turn, rebuilt from the deltas."""
        with self._read() as c:
            head, rows = self._session_rows(c, session_id)
        for t in rebuild_turns(rows):
            if t.row["idx"] == index:
                return t.request()
        return None

    def load_turns(self, session_id: str) -> list[Turn]:
        """The recorded turns of a session as `legorl.types.Turn` (token-exact)."""
        with self._read() as c:
            _, rows = self._session_rows(c, session_id)
        return [turn_of(session_id, t) for t in rebuild_turns(rows)]

    def load_trajectory(self, session_id: str) -> Trajectory | None:
        """The assembled trajectory (segments with token arrays, outcome) as `legorl.types.Trajectory`."""
        with self._read() as c:
            head = c.execute("SELECT * FROM trajectories WHERE session_id=?", (session_id,)).fetchone()
            if head is None:
                return None
            segs = c.execute("SELECT * FROM segments WHERE traj_id=? ORDER BY idx", (head["id"],)).fetchall()
            orow = c.execute("SELECT * FROM outcomes WHERE traj_id=?", (head["id"],)).fetchone()
        segments = []
        for s in segs:
            routing = codec.unpack_routing(s["routing"])
            segments.append(
                Segment(
                    turn_indices=loads(s["turn_indices"], []),
                    token_ids=codec.unpack_ids(s["token_ids"]).tolist(),
                    loss_mask=codec.unpack_ids(s["loss_mask"]).tolist(),
                    logprobs=codec.unpack_floats(s["logprobs"]).astype(float).tolist(),
                    policy_versions=codec.unpack_ids(s["policy_versions"]).tolist(),
                    routed_experts=as_routing(routing),
                )
            )
        outcome = None
        if orow is not None:
            outcome = Outcome(
                reward=orow["reward"],
                status=Status(orow["status"]),
                masked=bool(orow["masked"]),
                flags=loads(orow["flags"], []),
                tests=loads(orow["tests"], {}),
                evidence=loads(codec.unpack_text(orow["evidence"]), {}),
            )
        return Trajectory(
            session_id=session_id,
            segments=segments,
            stats=AlignmentStats(**loads(head["stats"], {})),
            instance_id=head["instance_id"] or "",
            harness=head["harness"] or "",
            step=head["step"] or 0,
            outcome=outcome,
            side_turns=loads(head["side_turns"], []),
        )

    def iter_session_ids(self, batch: int = 500) -> Iterator[str]:
        last = 0
        while True:
            with self._read() as c:
                rows = c.execute(
                    "SELECT id, session_id FROM trajectories WHERE id > ? ORDER BY id LIMIT ?", (last, batch)
                ).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            yield from (r[1] for r in rows)

    # ----------------------------------------------------------------- groups
    def group(self, step: int, instance_id: str) -> list[dict[str, Any]]:
        """The trajectories of one task in one step (a GRPO/GSPO group), with tests passed."""
        with self._read() as c:
            rows = c.execute(
                f"SELECT {SUMMARY_COLS}, o.tests {FROM} WHERE t.step=? AND t.instance_id=? ORDER BY t.id",
                (step, instance_id),
            ).fetchall()
        out = []
        for r in rows:
            d = summary(r)
            tests = loads(d.pop("tests"), {})
            d["tests_passed"] = sum(v == "passed" for v in tests.values())
            d["tests_total"] = len(tests)
            out.append(d)
        return out

    def task_stats(self, step: int | None) -> dict[str, dict[str, Any]]:
        """Per task: graded (non-masked) count, mean reward, resolved rate — optionally in one step."""
        cond, args = ("AND step = ?", [step]) if step is not None else ("", [])
        with self._read() as c:
            rows = c.execute(
                "SELECT instance_id, count(*), avg(reward), avg(status = 'resolved'), "
                "avg(reward * reward) - avg(reward) * avg(reward) FROM trajectories "
                f"WHERE status IS NOT NULL AND masked = 0 AND instance_id IS NOT NULL {cond} GROUP BY instance_id",
                args,
            ).fetchall()
        return {
            r[0]: {"n": r[1], "mean_reward": r[2], "resolved_rate": r[3], "reward_var": max(r[4] or 0.0, 0.0)}
            for r in rows
        }

    # ----------------------------------------------------------------- metrics, alerts, events
    def metric_keys(self) -> list[str]:
        with self._read() as c:
            return [r[0] for r in c.execute("SELECT DISTINCT key FROM metrics ORDER BY key")]

    def metrics(self, keys: list[str] | None = None, since_id: int = 0) -> dict[str, Any]:
        """{"series": {key: [[step, value], ...]}, "last_id": n} — the last value logged per step wins."""
        cond, args = "", [since_id]
        if keys:
            cond = f"AND key IN ({','.join('?' * len(keys))})"
            args += keys
        with self._read() as c:
            cur = c.cursor()
            cur.row_factory = None  # plain tuples: this can be tens of thousands of rows
            rows = cur.execute(
                f"SELECT id, step, key, value FROM metrics WHERE id > ? {cond} ORDER BY id", args
            ).fetchall()
        series: dict[str, dict[int, float | None]] = {}
        for _, step, key, value in rows:
            series.setdefault(key, {})[step] = value
        return {
            "series": {k: sorted(v.items()) for k, v in series.items()},
            "last_id": rows[-1][0] if rows else since_id,
        }

    def metrics_history(self) -> list[dict[str, float]]:
        """One dict per step (ascending), `{"step": s, key: value, ...}` — what the monitors read."""
        per_step: dict[int, dict[str, float]] = {}
        for key, points in self.metrics()["series"].items():
            for step, value in points:
                if value is not None:
                    per_step.setdefault(step, {"step": step})[key] = value
        return [per_step[s] for s in sorted(per_step)]

    def token_ledger(self, step: int | None = None) -> dict[str, Any]:
        """Where the sampled tokens went (legorl/ledger.py), per harness and in total: of one
        GSPO step, or summed over them all (the last value logged per step and key wins)."""
        cond, args = ("AND step = ?", (int(step),)) if step is not None else ("", ())
        with self._read() as c:
            rows = c.execute(
                f"SELECT step, key, value FROM metrics WHERE key LIKE 'ledger/%' {cond} ORDER BY id", args
            ).fetchall()
        per_step: dict[int, dict[str, float]] = {}
        for r in rows:
            per_step.setdefault(r["step"], {})[r["key"]] = r["value"] or 0.0
        harnesses: dict[str, ledger.TokenLedger] = {}
        total = ledger.TokenLedger()
        for metrics in per_step.values():
            for harness, led in ledger.from_metrics(metrics).items():
                harnesses.setdefault(harness, ledger.TokenLedger()).add(led)
                total.add(led)
        return {
            "step": step,
            "steps": len(per_step),
            "reasons": list(ledger.REASONS),
            "harnesses": {h: _ledger_row(led) for h, led in sorted(harnesses.items())},
            "total": _ledger_row(total),
        }

    def alerts(self, since_id: int = 0, limit: int = 500) -> list[dict[str, Any]]:
        with self._read() as c:
            rows = c.execute("SELECT * FROM alerts WHERE id > ? ORDER BY id DESC LIMIT ?", (since_id, limit)).fetchall()
        return [dict(r) for r in reversed(rows)]

    def events(self, since_id: int = 0, limit: int = 500) -> list[dict[str, Any]]:
        with self._read() as c:
            rows = c.execute("SELECT * FROM events WHERE id > ? ORDER BY id DESC LIMIT ?", (since_id, limit)).fetchall()
        return [{**dict(r), "data": loads(r["data"], {})} for r in reversed(rows)]


def _ledger_row(led: ledger.TokenLedger) -> dict[str, Any]:
    return {**led.as_dict(), "balanced": led.balanced}


def turn_of(session_id: str, t: RebuiltTurn) -> Turn:
    """A rebuilt row as the shared `Turn` dataclass (token-exact; logprobs float32-rounded)."""
    r = t.row
    routing = codec.unpack_routing(r["routing"])
    return Turn(
        session_id=session_id,
        index=r["idx"],
        dialect=Dialect(r["dialect"]),
        prompt_ids=t.prompt_ids.tolist(),
        completion_ids=t.completion_ids.tolist(),
        logprobs=codec.unpack_floats(r["logprobs"]).astype(float).tolist(),
        finish_reason=FinishReason(r["finish_reason"]),
        sampling_used=loads(r["sampling_used"], {}),
        sampling_requested=loads(r["sampling_requested"], {}),
        request=t.request(),
        response_text=r["response_text"] or "",
        tool_calls=loads(r["tool_calls"], []),
        routed_experts=as_routing(routing),
        routing_base=(r["routing_base"] or 0) if "routing_base" in r.keys() else 0,  # 0: a v1 store, read-only
        format_error=bool(r["format_error"]),
        side_call=bool(r["side_call"]),
        policy_version=r["policy_version"] or 0,
        model=r["model"] or "",
        t_start=r["t_start"] or 0.0,
        t_first_token=r["t_first_token"] or 0.0,
        t_end=r["t_end"] or 0.0,
    )


def compare_tasks(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]], eps: float = 1e-9) -> dict[str, Any]:
    """Tasks seen in both A and B, classified improved / regressed / same by mean reward."""
    rows = []
    for task in sorted(set(a) & set(b)):
        delta = b[task]["mean_reward"] - a[task]["mean_reward"]
        verdict = "improved" if delta > eps else ("regressed" if delta < -eps else "same")
        rows.append({"instance_id": task, "a": a[task], "b": b[task], "delta": delta, "verdict": verdict})
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("improved", "regressed", "same")}
    return {"tasks": rows, "counts": counts, "only_a": sorted(set(a) - set(b)), "only_b": sorted(set(b) - set(a))}
