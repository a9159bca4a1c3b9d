"""A writer SIGKILLed mid-run loses nothing it had committed, and the store stays readable."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from legorl.store.run_store import RunStore


def ids(sid: str, i: int) -> list[int]:
    """Token ids of turn i of a session: deterministic, so the reader can check every token."""
    s = int(sid.split("-")[1])
    return [(s * 7919 + i * 104729 + k * 31) % 50000 for k in range(40 + i)]


WRITER = inspect.getsource(ids) + textwrap.dedent("""
    import sys
    from legorl.store.run_store import RunStore
    from legorl.types import Dialect, FinishReason, Outcome, Status, Turn

    store = RunStore(sys.argv[1])
    n = 0
    while True:  # runs until killed
        sid = f"sess-{n // 5}"
        i = n % 5
        prompt = [] if i == 0 else [t for j in range(i) for t in ids(sid, j)]
        c = ids(sid, i)
        store.add_turn(Turn(session_id=sid, index=i, dialect=Dialect.ANTHROPIC, prompt_ids=prompt, completion_ids=c,
                            logprobs=[-k / 100 for k in range(len(c))], finish_reason=FinishReason.STOP,
                            sampling_used={},
                            request={"messages": [{"role": "user", "content": f"turn {i}"}] * (i + 1)}))
        print(f"turn {sid} {i}", flush=True)
        if i == 4:
            store.set_outcome(sid, Outcome(reward=1.0, status=Status.RESOLVED, tests={"t": "passed"}))
            print(f"outcome {sid}", flush=True)
        store.log_metrics(n, {"reward/mean": n / 10})
        print(f"metric {n}", flush=True)
        n += 1
""")


def test_sigkill_mid_run_loses_no_committed_record(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    committed: list[list[str]] = []
    reader: RunStore | None = None
    deadline = time.monotonic() + 120
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            committed.append(line.split())
            if len(committed) == 60 and reader is None:  # a concurrent reader (the UI) must not disturb it
                reader = RunStore(tmp_path, readonly=True)
                assert reader.list_trajectories()["total"] >= 1
            if len(committed) >= 600 or time.monotonic() > deadline:
                break
        os.killpg(proc.pid, signal.SIGKILL)  # mid-run: the writer is inside its loop
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len(committed) >= 600, "the writer did not get far enough"

    store = RunStore(tmp_path)  # reopening for writing recovers the WAL
    assert store._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    turns_by_sid: dict[str, dict[int, object]] = {}
    for c in committed:
        if c[0] == "turn":
            sid, i = c[1], int(c[2])
            if sid not in turns_by_sid:
                turns_by_sid[sid] = {t.index: t for t in store.load_turns(sid)}
            turn = turns_by_sid[sid].get(i)
            assert turn is not None, f"committed turn {sid}#{i} was lost"
            assert turn.completion_ids == ids(sid, i)
            assert turn.prompt_ids == [t for j in range(i) for t in ids(sid, j)]
            assert turn.request["messages"][-1]["content"] == f"turn {i}"
        elif c[0] == "outcome":
            assert store.get_trajectory(c[1])["status"] == "resolved"
    logged = {int(c[1]) for c in committed if c[0] == "metric"}
    assert logged <= {s for s, _ in store.metrics()["series"]["reward/mean"]}
    # the store is still writable after the crash
    store.log_metrics(10_000, {"reward/mean": 1.0})
    if reader is not None:
        reader.close()
    store.close()
