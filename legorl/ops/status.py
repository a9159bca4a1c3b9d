"""`legorl status [RUN_DIR]`: which run is alive, how far it has got, and whether it is sick.

Read-only by construction: the store is opened `readonly` (SQLite `query_only`), the only
other reads are file times and the run directory's lock (`liveness`). It works on a live run
(WAL lets it read while training writes) and on a finished one. Sickness is the named
signatures of `signatures.py`, each with the evidence it read; when none fits the report
says "no known signature matched" rather than "healthy": only known failures are looked for.

A directory that holds no run, a store that is corrupt or one a writer keeps locked ends
with one line and a non-zero exit (`StatusError`), never a traceback.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from legorl.loop.report import RESULTS_FILE, is_complete
from legorl.ops.liveness import liveness
from legorl.ops.signatures import Facts, match

NO_MATCH = "no known signature matched"
STALL_MIN_S = 600.0  # the stall limit is at least this, and 3 step-times on a slow run
PROBE_TIMEOUT_S = 2.0


class StatusError(Exception):
    """The directory holds no readable run; the message is the one line to print."""


def _probe(db: Path) -> None:
    """Fail fast and in words on a corrupt or writer-locked store (the store's own
    connections wait 30 s for a lock)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=PROBE_TIMEOUT_S)
        try:
            conn.execute("SELECT count(*) FROM runs").fetchone()
            conn.execute("SELECT count(*) FROM metrics").fetchone()
        finally:
            conn.close()
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            raise StatusError(f"{db}: the store is locked by a writer ({e}); try again in a moment") from None
        raise StatusError(f"{db}: not a readable run store ({e})") from None
    except sqlite3.DatabaseError as e:
        from legorl.store.schema import corrupt_message  # the words train, ui and export use

        raise StatusError(corrupt_message(db, e)) from None


def _last_write(db: Path) -> float:
    return max(p.stat().st_mtime for p in (db, db.with_name(db.name + "-wal")) if p.exists())


def _progress(steps: list[dict[str, Any]], planned: int, created: float, end: float) -> dict[str, Any]:
    done = [s for s in steps if s["step"] >= 0 and s.get("t_end")]
    span = (done[-1]["t_end"] - done[0]["t_start"]) if done else 0.0
    return {
        "step": steps[-1]["step"] if steps else None,
        "steps_done": len(done),
        "steps_planned": planned,
        "elapsed_s": round(max(end - created, 0.0), 1),
        "minutes_per_step": round(span / len(done) / 60, 3) if done else None,
    }


def status(run_dir: Path, *, stall_after_s: float | None = None, now: float | None = None) -> dict[str, Any]:
    """The status report of `run_dir` as a JSON-ready dict (see the module docstring)."""
    from legorl.monitor.monitors import MonitorConfig, RunFacts
    from legorl.store.run_store import RunStore
    from legorl.store.schema import db_path

    db = db_path(run_dir)
    if not db.is_file():
        raise StatusError(f"{run_dir} holds no run (no {db.name} in it)")
    _probe(db)
    now = time.time() if now is None else now
    try:
        with RunStore(run_dir, readonly=True) as store:
            info, steps, history = store.run_info(), store.steps(), store.metrics_history()
            formats = store.action_formats()
    except (sqlite3.DatabaseError, ValueError, KeyError) as e:
        raise StatusError(f"{db}: not a readable run store ({type(e).__name__}: {e})") from None
    cfg = info.get("config") or {}
    monitor = MonitorConfig.model_validate({k: v for k, v in (cfg.get("monitor") or {}).items() if k != "sinks"})
    live = liveness(Path(run_dir))
    last_write = _last_write(db)
    prog = _progress(
        steps,
        int((cfg.get("run") or {}).get("steps", 0)),
        float(info.get("created") or now),
        now if live.alive else last_write,
    )
    per_step_s = (prog["minutes_per_step"] or 0.0) * 60
    stall_s = stall_after_s if stall_after_s is not None else max(STALL_MIN_S, 3 * per_step_s)
    facts = Facts(history, monitor, RunFacts(formats), live.alive, now - last_write, stall_s, prog["steps_planned"])
    found = match(facts)
    # a report is rewritten after each evaluation, so only its `complete` says the run ended;
    # without one (no held-out), the steps do
    report = Path(run_dir) / RESULTS_FILE
    finished = (
        is_complete(Path(run_dir))
        if report.exists()
        else (prog["steps_planned"] > 0 and prog["steps_done"] >= prog["steps_planned"])
    )
    state = "running" if live.alive else ("finished" if finished else ("stopped" if live.alive is False else "unknown"))
    return {
        "run_dir": str(run_dir),
        "run_id": (info.get("info") or {}).get("run_id"),
        "state": state,
        "process": {"state": live.state, "pid": live.pid, "source": live.source},
        "progress": {
            **prog,
            "last_write": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last_write)),
            "last_write_age_s": round(now - last_write, 1),
        },
        "sick": bool(found),
        "verdict": "SICK" if found else "NO KNOWN FAILURE",
        "signatures": [m.as_dict() for m in found],
        "summary": "; ".join(m.name for m in found) if found else NO_MATCH,
        "stall_after_s": stall_s,
    }


def render(report: dict[str, Any]) -> str:
    """The report for people: a few lines, the evidence under each signature."""
    p = report["progress"]
    proc = report["process"]
    who = f"pid {proc['pid']} {proc['state']}" if proc["pid"] else f"process {proc['state']} ({proc['source']})"
    mps = f"{p['minutes_per_step']:.2f} min/step" if p["minutes_per_step"] is not None else "no step finished"
    at = f"step {p['step']}" if p["step"] is not None else "no GSPO step yet"
    lines = [
        f"run {report['run_dir']} ({report['run_id']}): {report['state']}, {who}",
        f"{at}: {p['steps_done']}/{p['steps_planned']} steps done, {p['elapsed_s'] / 60:.1f} min elapsed, "
        f"{mps}, last write {p['last_write']} ({p['last_write_age_s'] / 60:.1f} min ago)",
    ]
    if not report["signatures"]:
        lines.append(NO_MATCH)
    for m in report["signatures"]:
        lines.append(f"SICK: {m['name']} [{m['severity']}]")
        lines += [f"  read: {e}" for e in m["evidence"]]
        lines.append(f"  fix: {m['fix']}")
    return "\n".join(lines)
