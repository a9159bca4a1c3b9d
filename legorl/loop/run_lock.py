"""One writer per run directory: an OS lock held for the run's whole life.

`run_dir.py` decides whether a directory's *contents* are this run's; it cannot see a run
that is live. Two `legorl train` into one directory would both pass that check (the first
has recorded nothing yet) and merge into one store, and a `--resume` started while the run
is live would mark the live run's rollouts abandoned and train the same steps beside it.
So `legorl train` takes `RUN_DIR/.legorl.lock` with `flock` before it reads or writes
anything there, writes its pid into it, and holds it until it exits.

Why `flock` and not a pid file: the kernel releases the lock when its holder dies, however
it dies (SIGKILL, OOM), so a stale lock is taken over by the next start with no guessing
about whether a recorded pid is still ours. The lock file is never deleted (deleting it
while another process waits on the old inode would let two holders in); a run directory
keeps it, and `run_dir.py` does not count it as a run's output. The descriptor is opened
close-on-exec, so the sandboxes and servers a run starts never inherit the lock.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from legorl.loop.errors import RunError

LOCK_FILE = ".legorl.lock"


class RunDirLock:
    """The held lock of one run directory; `release()` (or leaving the `with`) frees it."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd: int | None = fd
        self.path = path

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def not_a_file(run_dir: Path) -> None:
    """`run.dir` is not an existing file (checked first: the set-up would spend its seconds
    and then fail with a traceback where the store is opened)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunError(f"run.dir {run_dir} is a file, not a directory: set run.dir to a directory (created if missing)")


def usable_dir(run_dir: Path) -> None:
    """`run.dir` is a directory, or is created as one; else one line saying why not."""
    not_a_file(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(
            f"run.dir {run_dir}: cannot create it ({e.strerror or e}): set run.dir to a writable directory"
        ) from None


def lock_run_dir(run_dir: Path) -> RunDirLock:
    """Take the run directory's lock, or fail in one line naming the live holder's pid
    (nothing in the directory is touched then)."""
    usable_dir(run_dir)
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RunError(f"run.dir {run_dir}: cannot open its lock file {LOCK_FILE} ({e.strerror or e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunError(
            f"run.dir {run_dir} is in use by {_holder(path)}: a run directory has one writer; wait for that "
            "run to end (or stop it), then start or `--resume` it, or set another run.dir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return RunDirLock(fd, path)


def _holder(path: Path) -> str:
    """Who holds the lock, from the pid it wrote (it may not have written it yet: wait a little)."""
    pid = None
    for _ in range(20):
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        if text.isdigit():
            pid = int(text)
            break
        time.sleep(0.05)
    if pid is None:
        return "another legorl process (pid unknown)"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:  # the lock outlived its taker: a process it started still holds it
        return f"a process left over from legorl pid {pid} (no longer running; end its leftover processes)"
    except PermissionError:
        pass
    return f"another legorl process (pid {pid})"
