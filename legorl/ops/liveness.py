"""Which process holds a run directory, and whether it is alive.

`legorl train` holds `RUN_DIR/.legorl.lock` (`legorl.loop.run_lock.LOCK_FILE`, an flock)
for the run's whole life and writes its pid into it; the file stays after the run ends.
This module is the one place `legorl status` reads it, without touching the lock (taking
it, even for a moment, could turn away a run that is starting): the pid is read from the
file (a bare integer, or JSON with `pid`) and the process asked whether it still exists and
is a legorl process. A directory without a lock file (a run from before the lock, or a
legorl without it) is `unknown`, never a guess.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Liveness:
    state: str  # alive | not running | unknown
    pid: int | None = None
    source: str = ""  # where the pid came from, or why it is unknown

    @property
    def alive(self) -> bool | None:
        return {"alive": True, "not running": False}.get(self.state)


def lock_path(run_dir: Path) -> Path | None:
    """The run directory's lock file (None for a legorl without the lock)."""
    try:
        from legorl.loop.run_lock import LOCK_FILE
    except ImportError:
        return None
    return run_dir / LOCK_FILE


def read_pid(path: Path) -> int | None:
    """The holder's pid from a lock file: a bare integer, or JSON with `pid`."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    pid = value.get("pid") if isinstance(value, dict) else value
    return pid if isinstance(pid, int) and pid > 0 else None


def pid_alive(pid: int) -> bool:
    """The process exists (and, where /proc says, is a legorl process: pids are reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    cmdline = Path(f"/proc/{pid}/cmdline")
    try:
        return b"legorl" in cmdline.read_bytes()
    except OSError:
        return True  # no /proc to ask: existence is all we know


def liveness(run_dir: Path) -> Liveness:
    path = lock_path(run_dir)
    if path is None:
        return Liveness("unknown", source="this legorl writes no run-directory lock")
    if not path.exists():
        return Liveness("unknown", source=f"no lock file {path.name} (a run from before the lock)")
    pid = read_pid(path)
    if pid is None:
        return Liveness("unknown", source=f"{path.name} names no pid")
    return Liveness("alive" if pid_alive(pid) else "not running", pid, f"{path.name}")
