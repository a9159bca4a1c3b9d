"""Export a run store to JSONL (one trajectory per line) or Parquet (one file per table).

Both stream trajectory by trajectory, so a run far larger than memory exports fine. The
JSONL form is the `legorl.types` dataclasses as dicts (`Turn.to_dict()` per turn plus the
trainer logprobs and token pieces the store adds), i.e. what another tool would need to
retrain from the recorded tokens. The Parquet form is columnar for analysis: token ids and
logprobs as list<int32>/list<float32> columns, requests as JSON strings.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from legorl.store import codec
from legorl.store.queries import turn_of
from legorl.store.rebuild import dumps, loads, rebuild_turns
from legorl.store.run_store import RunStore


def _turn_records(store: RunStore, session_id: str) -> list[dict[str, Any]]:
    with store._read() as c:
        rows = c.execute(
            "SELECT turns.* FROM turns JOIN trajectories t ON t.id = turns.traj_id WHERE t.session_id=? ORDER BY idx",
            (session_id,),
        ).fetchall()
    out = []
    for rebuilt in rebuild_turns(rows):
        d = turn_of(session_id, rebuilt).to_dict()
        r = rebuilt.row
        d["trainer_logprobs"] = (
            codec.unpack_floats(r["trainer_logprobs"]).astype(float).tolist() if r["trainer_logprobs"] else None
        )
        d["completion_pieces"] = loads(codec.unpack_text(r["pieces"]), None) if r["pieces"] else None
        out.append(d)
    return out


def iter_records(store: RunStore) -> Iterator[dict[str, Any]]:
    """One dict per session: trajectory fields, advantage, outcome, segments and turns."""
    for sid in store.iter_session_ids():
        traj = store.load_trajectory(sid)
        with store._read() as c:
            row = c.execute(
                "SELECT step, instance_id, harness, advantage, status FROM trajectories WHERE session_id=?", (sid,)
            ).fetchone()
        rec = traj.to_dict() if traj is not None else {"session_id": sid}
        rec.update(step=row["step"], instance_id=row["instance_id"], harness=row["harness"], advantage=row["advantage"])
        rec["turns"] = _turn_records(store, sid)
        yield rec


def export_jsonl(store: RunStore, out_path: Path | str) -> int:
    """Write every session as one JSON line; returns the number written."""
    n = 0
    with open(out_path, "wb") as f:
        for rec in iter_records(store):
            f.write(orjson.dumps(rec, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS) + b"\n")
            n += 1
    return n


TRAJ_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("step", pa.int64()),
        ("instance_id", pa.string()),
        ("harness", pa.string()),
        ("status", pa.string()),
        ("reward", pa.float64()),
        ("masked", pa.bool_()),
        ("advantage", pa.float64()),
        ("flags", pa.list_(pa.string())),
        ("tests", pa.string()),
        ("diff", pa.string()),
        ("n_turns", pa.int64()),
        ("n_segments", pa.int64()),
        ("stats", pa.string()),
    ]
)
TURN_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("index", pa.int64()),
        ("dialect", pa.string()),
        ("finish_reason", pa.string()),
        ("policy_version", pa.int64()),
        ("side_call", pa.bool_()),
        ("format_error", pa.bool_()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("trainer_logprobs", pa.list_(pa.float32())),
        ("completion_pieces", pa.list_(pa.string())),
        ("request", pa.string()),
        ("response_text", pa.string()),
        ("tool_calls", pa.string()),
        ("t_start", pa.float64()),
        ("t_end", pa.float64()),
    ]
)


def export_parquet(store: RunStore, out_dir: Path | str, batch: int = 200) -> dict[str, int]:
    """Write trajectories/turns/metrics/alerts .parquet files into `out_dir`; returns row counts."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"trajectories": 0, "turns": 0}
    with (
        pq.ParquetWriter(out / "trajectories.parquet", TRAJ_SCHEMA) as tw,
        pq.ParquetWriter(out / "turns.parquet", TURN_SCHEMA) as uw,
    ):
        trajs: list[dict[str, Any]] = []
        turns: list[dict[str, Any]] = []

        def flush() -> None:
            if trajs:
                tw.write_table(pa.Table.from_pylist(trajs, TRAJ_SCHEMA))
            if turns:
                uw.write_table(pa.Table.from_pylist(turns, TURN_SCHEMA))
            counts["trajectories"] += len(trajs)
            counts["turns"] += len(turns)
            trajs.clear()
            turns.clear()

        for rec in iter_records(store):
            o = rec.get("outcome") or {}
            ev = o.get("evidence") or {}
            trajs.append(
                {
                    "session_id": rec["session_id"],
                    "step": rec.get("step"),
                    "instance_id": rec.get("instance_id"),
                    "harness": rec.get("harness"),
                    "status": o.get("status"),
                    "reward": o.get("reward"),
                    "masked": o.get("masked"),
                    "advantage": rec.get("advantage"),
                    "flags": o.get("flags", []),
                    "tests": dumps(o.get("tests", {})),
                    "diff": ev.get("diff") or ev.get("patch"),
                    "n_turns": len(rec["turns"]),
                    "n_segments": len(rec.get("segments", [])),
                    "stats": dumps(rec.get("stats", {})),
                }
            )
            for t in rec["turns"]:
                turns.append(
                    {
                        **{k: t.get(k) for k in TURN_SCHEMA.names},
                        "request": dumps(t["request"]),
                        "tool_calls": dumps(t["tool_calls"]),
                    }
                )
            if len(trajs) >= batch:
                flush()
        flush()
    metrics = store.metrics()["series"]
    pq.write_table(
        pa.Table.from_pylist(
            [{"step": s, "key": k, "value": v} for k, pts in metrics.items() for s, v in pts],
            pa.schema([("step", pa.int64()), ("key", pa.string()), ("value", pa.float64())]),
        ),
        out / "metrics.parquet",
    )
    alerts = store.alerts(limit=1_000_000)
    pq.write_table(
        pa.Table.from_pylist(
            [{k: a[k] for k in ("step", "name", "severity", "message", "value", "threshold", "t")} for a in alerts],
            pa.schema(
                [
                    ("step", pa.int64()),
                    ("name", pa.string()),
                    ("severity", pa.string()),
                    ("message", pa.string()),
                    ("value", pa.float64()),
                    ("threshold", pa.float64()),
                    ("t", pa.float64()),
                ]
            ),
        ),
        out / "alerts.parquet",
    )
    counts["metrics"] = sum(len(p) for p in metrics.values())
    counts["alerts"] = len(alerts)
    return counts
