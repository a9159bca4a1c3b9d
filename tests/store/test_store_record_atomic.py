"""A rollout's record (its session, turns, trajectory and outcome) reaches the run store
whole or not at all: a SIGKILL of the writer or a full disk never leaves a trajectory row
with turns but no status, which the loop, the monitors and the UI would read as a rollout
still running (or, summed over a step, as one that silently went missing)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

WRITER = textwrap.dedent("""
    import sys
    from legorl.loop.run import record
    from legorl.loop.worker import RolloutRecord
    from legorl.store.run_store import RunStore
    from legorl.trajectory import assemble
    from legorl.types import Dialect, FinishReason, Outcome, Status, Turn

    class Tok:  # record() decodes every completion token into its piece
        def decode(self, ids):
            return f"<{ids[0]}>"

    def rollout(n):
        sid, turns, prompt = f"sess-{n}", [], []
        for i in range(6):
            c = [(n * 7919 + i * 104729 + k * 31) % 50000 for k in range(400)]
            turns.append(Turn(session_id=sid, index=i, dialect=Dialect.OPENAI_CHAT, prompt_ids=list(prompt),
                              completion_ids=c, logprobs=[-0.5] * len(c), finish_reason=FinishReason.STOP,
                              sampling_used={}, request={"messages": [{"role": "user", "content": f"turn {i}"}]}))
            prompt += c + [7, 8, 9]
        outcome = Outcome(reward=float(n % 2), status=Status.RESOLVED if n % 2 else Status.FAILED,
                          evidence={"diff": "x" * 2000})
        traj = assemble(turns, sid, instance_id=f"task-{n % 3}", step=0, outcome=outcome)
        return RolloutRecord(trajectory=traj, turns=turns, result=None)

    store = RunStore(sys.argv[1])
    n = 0
    while True:  # until killed, or the disk is full
        record(store, [rollout(n)], Tok())
        print(f"recorded sess-{n}", flush=True)
        n += 1
""")


def half_written(run: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(run / "run.sqlite") as db:
        return list(db.execute("SELECT session_id, n_turns FROM trajectories WHERE status IS NULL"))


def graded(run: Path) -> dict[str, int]:
    with sqlite3.connect(run / "run.sqlite") as db:
        return dict(db.execute("SELECT session_id, n_turns FROM trajectories WHERE status IS NOT NULL"))


def test_sigkill_between_the_writes_of_a_record_leaves_no_half_record(tmp_path: Path) -> None:
    """The writer is killed at arbitrary instants (each run a few records in, at a random
    offset): every record it reported is whole, and no row lacks its outcome."""
    import random

    rng = random.Random(0)
    recorded: list[str] = []
    for attempt in range(2):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path / f"run{attempt}")],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                recorded.append(line.split()[1])
                if len(recorded) % 8 == 0:  # after a few records, at a random instant inside a later one
                    time.sleep(rng.uniform(0.0, 0.05))
                    break
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        run = tmp_path / f"run{attempt}"
        assert half_written(run) == [], f"attempt {attempt}: trajectory rows without an outcome"
        whole = graded(run)
        assert all(n == 6 for n in whole.values()), whole
    assert len(recorded) == 16


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_full_disk_mid_record_leaves_no_half_record(tmp_path: Path) -> None:
    """The run store on a 1 MB tmpfs: the record that does not fit ends the writer with the
    one-line RunError, and the store holds only whole records."""
    run = tmp_path / "run"
    run.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(run)], check=True)
    try:
        proc = subprocess.run([sys.executable, "-c", WRITER, str(run)], capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "Free space there" in proc.stderr, proc.stderr[-2000:]
        reported = {line.split()[1] for line in proc.stdout.splitlines()}
        assert len(reported) >= 2, "the disk filled before two records were written"
        subprocess.run(["mount", "-o", "remount,size=8m", str(run)], check=True)  # room to recover the WAL
        assert half_written(run) == []
        whole = graded(run)
        assert reported <= set(whole) and all(n == 6 for n in whole.values()), whole
    finally:
        subprocess.run(["umount", "-l", str(run)], check=False)
