"""SQLite schema of a run store (`DIR/run.sqlite`) and how connections to it are opened.

One file per run directory, WAL journal: the proxy, the rollout loop and the trainer write
through their own connections while the UI reads through others, and readers never block
writers. Every write is its own short `BEGIN IMMEDIATE` transaction, so a record is
either fully committed or absent; with `synchronous=FULL` a committed record also
survives a power cut, not just a killed process.

Trajectory rows are the hub: one per session, created by the first turn (so running
sessions show up live) and completed by the assembled trajectory and its outcome. `rev`
is a store-wide counter bumped on every change of a trajectory row; the UI's live stream
asks "what changed after rev N" through its index.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from legorl.loop.errors import RunError

SCHEMA_VERSION = 2  # v2: turns.routing_base
TURN_ROW_BITS = 20  # full-text rowid = trajectory id << 20 | turn index
OUTCOME_FTS_SLOT = (1 << TURN_ROW_BITS) - 1  # the row that indexes a trajectory's diff

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY, name TEXT, created REAL, config TEXT, info TEXT);
CREATE TABLE IF NOT EXISTS steps (
  step INTEGER PRIMARY KEY, policy_version INTEGER, t_start REAL, t_end REAL, info TEXT);
CREATE TABLE IF NOT EXISTS trajectories (
  id INTEGER PRIMARY KEY,
  session_id TEXT NOT NULL UNIQUE,
  step INTEGER, instance_id TEXT, harness TEXT,
  status TEXT,                      -- NULL until graded
  reward REAL, masked INTEGER NOT NULL DEFAULT 0, n_flags INTEGER NOT NULL DEFAULT 0,
  advantage REAL,
  n_turns INTEGER NOT NULL DEFAULT 0, n_segments INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0,
  assembled INTEGER NOT NULL DEFAULT 0,
  stats TEXT, side_turns TEXT,
  created REAL, updated REAL, rev INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS traj_rev ON trajectories(rev);
CREATE INDEX IF NOT EXISTS traj_status ON trajectories(status, id);
CREATE INDEX IF NOT EXISTS traj_step ON trajectories(step, id);
CREATE INDEX IF NOT EXISTS traj_task ON trajectories(instance_id, step, id);
CREATE INDEX IF NOT EXISTS traj_harness ON trajectories(harness, id);
CREATE INDEX IF NOT EXISTS traj_reward ON trajectories(reward, id);
CREATE TABLE IF NOT EXISTS flags (
  flag TEXT NOT NULL, traj_id INTEGER NOT NULL, PRIMARY KEY (flag, traj_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outcomes (
  traj_id INTEGER PRIMARY KEY, reward REAL, status TEXT, masked INTEGER, flags TEXT,
  tests TEXT, evidence BLOB, t REAL);
CREATE TABLE IF NOT EXISTS turns (
  id INTEGER PRIMARY KEY,
  traj_id INTEGER NOT NULL, idx INTEGER NOT NULL,
  dialect TEXT, finish_reason TEXT, policy_version INTEGER, model TEXT,
  side_call INTEGER, format_error INTEGER,
  n_prompt INTEGER, prompt_base INTEGER, prompt_tail BLOB,   -- prompt = prev(prompt+completion)[:base] + tail
  n_completion INTEGER, completion_ids BLOB, logprobs BLOB, trainer_logprobs BLOB,
  routing BLOB, routing_base INTEGER DEFAULT 0, pieces BLOB, -- routing of positions base..
  list_key TEXT, msg_base INTEGER, new_items BLOB,           -- request list = prev list[:msg_base] + new
  request_rest BLOB,                                         -- NULL: same as the previous turn
  response_text TEXT, tool_calls TEXT,
  sampling_used TEXT, sampling_requested TEXT,
  t_start REAL, t_first_token REAL, t_end REAL,
  UNIQUE (traj_id, idx));
CREATE TABLE IF NOT EXISTS segments (
  traj_id INTEGER NOT NULL, idx INTEGER NOT NULL,
  turn_indices TEXT, n_tokens INTEGER, n_sampled INTEGER,
  token_ids BLOB, loss_mask BLOB, logprobs BLOB, policy_versions BLOB, routing BLOB,
  trainer_logprobs BLOB,
  PRIMARY KEY (traj_id, idx));
CREATE TABLE IF NOT EXISTS metrics (
  id INTEGER PRIMARY KEY, step INTEGER NOT NULL, key TEXT NOT NULL, value REAL, t REAL);
CREATE INDEX IF NOT EXISTS metrics_key ON metrics(key, step);
CREATE INDEX IF NOT EXISTS metrics_step ON metrics(step);
CREATE TABLE IF NOT EXISTS alerts (
  id INTEGER PRIMARY KEY, step INTEGER, name TEXT, severity TEXT, message TEXT,
  value REAL, threshold REAL, t REAL);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY, step INTEGER, kind TEXT, data TEXT, t REAL);
CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(text, columnsize=0);
"""


def db_path(path: Path | str) -> Path:
    """A run directory means `DIR/run.sqlite`; a path ending in .sqlite/.db is the file itself."""
    p = Path(path)
    return p if p.suffix in (".sqlite", ".db") else p / "run.sqlite"


class StoreCorrupt(RunError):
    """The run store's file is not a readable SQLite database (truncated, overwritten): one
    line naming the file and what to do, in `train`, `--resume`, `ui` and `export` alike,
    never SQLite's traceback or a UI that answers 500 to everything."""


def corrupt_message(path: Path, err: BaseException) -> str:
    return (
        f"cannot read the run store {path}: it is corrupt ({err}), so it cannot be shown, exported or resumed. "
        "Restore it from a copy, or move it away (`legorl train CONFIG --overwrite` starts the run over and "
        "deletes it)"
    )


@contextmanager
def readable(path: Path) -> Iterator[None]:
    """SQLite's 'file is not a database' / 'disk image is malformed' as `StoreCorrupt`.
    An `OperationalError` (locked, no such table, disk full) is not corruption: it passes."""
    try:
        yield
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as e:
        raise StoreCorrupt(corrupt_message(path, e)) from None


def connect(path: Path, *, readonly: bool, durable: bool = True) -> sqlite3.Connection:
    """Open a connection with the pragmas every store connection needs.

    `readonly` connections still open the file read-write at the OS level (a WAL reader
    must be able to map the -shm file) but refuse writes with `query_only`.
    """
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    with readable(path):
        conn.execute("PRAGMA busy_timeout=30000")
        if readonly:
            conn.execute("PRAGMA query_only=ON")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # reads the header and the schema
        else:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            conn.execute("PRAGMA foreign_keys=OFF")
    return conn


def init_schema(conn: sqlite3.Connection) -> None:
    """Create missing tables; refuse a store written by a newer schema."""
    conn.executescript(SCHEMA)
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None:
        conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    elif int(row[0]) > SCHEMA_VERSION:
        raise RuntimeError(f"run store schema v{row[0]} is newer than this legorl (v{SCHEMA_VERSION}); upgrade legorl")
    elif int(row[0]) < SCHEMA_VERSION:
        _migrate(conn, int(row[0]))


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """Bring an older store up to SCHEMA_VERSION in place (additive changes only)."""
    with conn:
        if version < 2:
            cols = {r[1] for r in conn.execute("PRAGMA table_info(turns)")}
            if "routing_base" not in cols:
                conn.execute("ALTER TABLE turns ADD COLUMN routing_base INTEGER DEFAULT 0")
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
