"""A run directory belongs to one run.

`legorl train` into a directory that already holds a run would otherwise merge the two:
its store would mix their trajectories, the old run's newer-numbered checkpoints would
outrank (and, under `keep_checkpoints`, prune) the new run's, and a later `--resume` would
load the old run's weights. So:

- a fresh start claims the directory: it must be empty, or hold only a store that recorded
  nothing (a start that failed before its first rollout); otherwise it is refused with one
  line (resume it, choose another directory, or `--overwrite`);
- `--overwrite` deletes what a run writes there (its store, checkpoints, weights, report)
  and refuses to delete anything else;
- the run directory's lock (`run_lock.py`, taken first) keeps a live run's directory from
  a second writer; its lock file is not a run's output;
- the run gets an id when it is created, kept in the store and in every checkpoint next to
  the config's hash, and `--resume` loads only a checkpoint of this run and this config.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.loop.report import RESULTS_FILE
from legorl.loop.run_lock import LOCK_FILE
from legorl.store.schema import StoreCorrupt, db_path, readable
from legorl.train.checkpoint import STEP_DIR

# Settings that say where a run lives, how it is watched or how many rollouts it keeps in
# flight, not what it trains: a run directory may be moved, its UI served on another port,
# or a run resumed with fewer rollouts at once (a semaphore: every group still completes;
# 32 OpenCode processes on two cores ran some demonstrations past their time limit), and
# still be resumed.
NOT_HASHED = (
    ("run", "dir"),
    ("run", "ui"),
    ("run", "ui_port"),
    ("run", "max_concurrent_rollouts"),
    ("trainer", "checkpoint_dir"),
)
STORE_FILES = ("run.sqlite", "run.sqlite-wal", "run.sqlite-shm", "run.sqlite-journal")
CONTROL_START_FILE = "control_start.pt"  # where the control begins (phases.keep_control_start)
KL_REFERENCE_FILE = "kl_reference.pt"  # π_ref of `[trainer] kl_coef` (phases.hold_kl_reference)
RUN_OUTPUTS = (
    *STORE_FILES,
    "checkpoints",
    "weights",
    RESULTS_FILE,
    Path(RESULTS_FILE).with_suffix(".tmp").name,
    CONTROL_START_FILE,
    Path(CONTROL_START_FILE).with_suffix(".tmp").name,
    KL_REFERENCE_FILE,
    Path(KL_REFERENCE_FILE).with_suffix(".tmp").name,
)


def hashed_config(cfg: RunConfig) -> dict[str, Any]:
    data = cfg.model_dump(mode="json")
    for section, key in NOT_HASHED:
        data.get(section, {}).pop(key, None)
    return data


def config_hash(cfg: RunConfig) -> str:
    """sha256 of the config as validated (defaults filled in), less `NOT_HASHED`."""
    text = json.dumps(hashed_config(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def checkpoint_dir(cfg: RunConfig) -> Path:
    return Path(cfg.trainer.checkpoint_dir) if cfg.trainer.checkpoint_dir else cfg.run.dir / "checkpoints"


def _checkpoints(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if STEP_DIR.match(p.name) or p.name.startswith(".tmp_step_"))


def _recorded(store: Path) -> int:
    """Trajectories and metrics a store holds (0 for a store that recorded nothing);
    `StoreCorrupt` for a file that is not a readable store (it is not ours to call empty,
    and "a run with 1 records" would send the user to a `--resume` that cannot read it)."""
    if not store.exists():
        return 0
    try:
        with readable(store), sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
            return sum(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("trajectories", "metrics"))
    except sqlite3.OperationalError as e:
        return 0 if "no such table" in str(e) else 1  # a store created but never written / busy: not empty


def _is_empty_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and all(_is_empty_dir(c) for c in p.iterdir())


def holdings(cfg: RunConfig) -> list[str]:
    """What in the run directory (and an outside checkpoint directory) belongs to a run
    already: empty directories and a store that recorded nothing do not count."""
    run_dir, ckpt = cfg.run.dir, checkpoint_dir(cfg)
    found: list[str] = []
    if run_dir.is_dir():
        store = db_path(run_dir)
        for p in sorted(run_dir.iterdir()):
            if p.name in STORE_FILES or p.name == LOCK_FILE or _is_empty_dir(p) or p == ckpt:
                continue
            found.append(p.name)
        if n := _recorded(store):
            found.insert(0, f"{store.name} with {n} records")
    if n := len(_checkpoints(ckpt)):
        found.append(f"{n} checkpoint(s) in {ckpt}")
    return found


def claim(cfg: RunConfig, *, overwrite: bool) -> None:
    """Make `run.dir` this run's before anything is written (see the module docstring)."""
    try:
        held = holdings(cfg)
    except StoreCorrupt:
        if not overwrite:
            raise
        held = ["a corrupt run store"]
    if not held:
        return
    run_dir = cfg.run.dir
    if not overwrite:
        raise RunError(
            f"run.dir {run_dir} already holds a run ({', '.join(held[:4])}): `legorl train CONFIG --resume` "
            "continues it; set another run.dir, or pass --overwrite to delete it first"
        )
    foreign = (
        sorted(p.name for p in run_dir.iterdir() if p.name not in (*RUN_OUTPUTS, LOCK_FILE) and not _is_empty_dir(p))
        if run_dir.is_dir()
        else []
    )
    if foreign:
        raise RunError(
            f"--overwrite: run.dir {run_dir} holds files a run does not write ({', '.join(foreign[:5])}); "
            "refusing to delete them: move them, or set another run.dir"
        )
    for name in RUN_OUTPUTS:
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    for p in _checkpoints(checkpoint_dir(cfg)):
        shutil.rmtree(p)


def check_checkpoint(ckpt: Path, data_state: dict[str, Any], run_info: dict[str, Any], cfg: RunConfig) -> None:
    """`--resume`: the checkpoint must be this run's (its run id is the store's) and of this
    config (same hash); else one line saying whose it is, or which settings changed."""
    mine, theirs = run_info.get("info", {}).get("run_id"), data_state.get("run_id")
    if theirs is None:
        raise RunError(f"--resume: checkpoint {ckpt} has no run id (it was not written by `legorl train`)")
    if mine != theirs:
        raise RunError(
            f"--resume: checkpoint {ckpt} belongs to run {theirs}, not to {cfg.run.dir}'s run {mine}: "
            "another run's checkpoint directory? Set trainer.checkpoint_dir, or start over with --overwrite"
        )
    if data_state.get("config_hash") != config_hash(cfg):
        stored = run_info.get("config")
        changed = _changed(stored or {}, hashed_config(cfg))
        if stored and not changed:  # hashed when NOT_HASHED was shorter: the settings say it is the same
            return
        raise RunError(
            f"--resume: the config differs from the one run {mine} was started with"
            + (f" ({', '.join(changed[:6])})" if changed else "")
            + ": restore it to resume, or start a new run (another run.dir, or --overwrite)"
        )


def _changed(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted names of the settings that differ between two config dicts."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            if (prefix.rstrip("."), k) in NOT_HASHED:
                continue
            out += _changed(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [prefix.rstrip(".")]
