"""One writer per run directory (issue 39, item 3).

Before the lock, two `legorl train` into one directory merged into one store, and a
`--resume` started while the run was live marked the live run's rollouts abandoned and
trained the same steps beside it. Now the run holds `RUN_DIR/.legorl.lock` (flock, with
its pid in it) for its whole life: a second start and a live `--resume` fail in one line
naming the holder's pid and touch nothing; a lock whose holder was SIGKILLed is free.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from legorl.loop.errors import RunError
from legorl.loop.run_lock import LOCK_FILE, lock_run_dir
from tests.helpers.loop_util import one_call_agent

LEGORL = [sys.executable, "-m", "legorl.cli"]
AGENT = one_call_agent(max_tokens=4, sleep_s=1)
CONFIG = """
[run]
dir = "{dir}"
tasks = "quickstart-calc"
steps = 200
tasks_per_step = 1
group_size = 2
[calc_tasks]
train = 8
heldout = 4
[engine]
kind = "hf"
model = "quickstart-qwen3"
[proxy]
max_tokens = 4
[harness]
name = "command"
command_file = "{agent}"
[trainer]
model = "quickstart-qwen3"
lr = 1e-5
"""
HOLD = "import sys, time; from pathlib import Path; from legorl.loop.run_lock import lock_run_dir\n"
HOLD += "lock = lock_run_dir(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)"


def one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _store(run_dir: Path) -> dict[str, object]:
    with sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True) as db:
        return {
            "runs": [json.loads(r[0]).get("run_id") for r in db.execute("SELECT info FROM runs")],
            "abandoned": db.execute("SELECT count(*) FROM flags WHERE flag = 'abandoned'").fetchone()[0],
            "steps": db.execute("SELECT count(*) FROM trajectories WHERE step >= 0").fetchone()[0],
        }


def test_a_second_start_and_a_live_resume_fail_naming_the_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (tmp_path / "agent.sh").write_text(AGENT)
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(dir=run_dir, agent=tmp_path / "agent.sh"))
    live = subprocess.Popen(
        [*LEGORL, "train", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and live.poll() is None:  # until its first rollout is recorded
            try:
                if _store(run_dir)["steps"]:
                    break
            except sqlite3.OperationalError:
                pass
            time.sleep(0.1)
        assert live.poll() is None, live.stderr.read().decode()[-3000:] if live.stderr else live.returncode
        assert (run_dir / LOCK_FILE).read_text().strip() == str(live.pid)
        before = _store(run_dir)
        for flags in ((), ("--resume",), ("--overwrite",)):
            proc = subprocess.run(
                [*LEGORL, "train", str(config), *flags], capture_output=True, text=True, timeout=300, check=False
            )
            one_line(proc, f"is in use by another legorl process (pid {live.pid})", "one writer")
        assert live.poll() is None  # the live run goes on, untouched
        after = _store(run_dir)
        assert after["runs"] == before["runs"] and after["abandoned"] == 0, (before, after)
        assert (run_dir / "run.sqlite").exists() and (run_dir / LOCK_FILE).read_text().strip() == str(live.pid)
    finally:
        if live.poll() is None:
            os.killpg(live.pid, signal.SIGKILL)
        live.wait(30)
    with lock_run_dir(run_dir) as lock:  # its holder died: the lock is free, and says whose it is now
        assert Path(lock.path).read_text().strip() == str(os.getpid())


def test_a_lock_held_by_a_killed_process_is_taken_over(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RunError, match=rf"in use by another legorl process \(pid {holder.pid}\)"):
            lock_run_dir(tmp_path / "run")
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(30)
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
    lock = lock_run_dir(tmp_path / "run")
    try:
        assert (tmp_path / "run" / LOCK_FILE).read_text().strip() == str(os.getpid())
        with pytest.raises(RunError, match="in use by another legorl process"):  # one holder, even in one process
            lock_run_dir(tmp_path / "run")
    finally:
        lock.release()
    lock_run_dir(tmp_path / "run").release()  # released: free again


def test_a_run_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("not a directory")
    with pytest.raises(RunError, match="is a file, not a directory"):
        lock_run_dir(tmp_path / "run")
