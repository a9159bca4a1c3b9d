"""The production loop learns: `legorl train` on a slice of the quickstart (the warm
mini-swe-agent in local sandboxes, the proxy, the hf engine, grading by legorl.verify, the
run store, GSPO), seed fixed, and the held-out success must rise by a margin.

Benchmarks are not asserted here (bench/quickstart.py prints the full run's figures);
only that learning happened, with margins far outside the run-to-run noise of this size.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from legorl.harness.install import HarnessNotInstalled, require
from tests.helpers.learn_util import LEGORL, assert_learns, slice_config

pytestmark = [pytest.mark.harness, pytest.mark.slow]
try:
    require("mini-swe-agent")
except HarnessNotInstalled as e:
    pytest.skip(f"mini-swe-agent not installed: {e}", allow_module_level=True)


@pytest.mark.timeout(1800)  # ~4 min on an idle 2-core machine; far longer when it is shared
def test_legorl_train_learns_on_held_out_tasks(tmp_path: Path) -> None:
    """Synchronously: 12 steps (learn_util.assert_learns says what is checked and why)."""
    assert_learns(tmp_path, max_staleness=0, steps=12)


@pytest.mark.timeout(1800)
def test_legorl_train_learns_on_held_out_tasks_asynchronously(tmp_path: Path) -> None:
    """16 steps with the next step's rollouts running while the trainer trains."""
    assert_learns(tmp_path, max_staleness=1, steps=16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sigkill_mid_step_loses_no_graded_rollout(tmp_path: Path) -> None:
    """Rollouts are stored as they are graded: the live UI lists the running step's rollouts
    before the step ends; kill -9 during the step, and every rollout graded before the kill
    is in the store with its outcome and turns; the step never closed."""
    config = slice_config(tmp_path, steps=2, episodes=16, sft_steps=5, heldout_tasks=0)
    port = free_port()
    text = config.read_text().replace('at = ["start", "warm_start", "end"]', "at = []")
    text = text.replace("[run]\n", f"[run]\nui = true\nui_port = {port}\n", 1)
    config.write_text(text)
    token = "live-ui-token"  # the run's UI asks a token (docs/security.md): the run's, from the environment
    proc = subprocess.Popen(
        [*LEGORL, "train", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "LEGORL_TOKEN": token},
    )

    def api(path: str) -> object:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"authorization": f"Bearer {token}"})
        return json.loads(urllib.request.urlopen(req, timeout=10).read())

    db_path = tmp_path / "run" / "run.sqlite"
    seen = 0
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if db_path.exists():
                try:
                    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
                        seen = db.execute(
                            "SELECT count(*) FROM trajectories WHERE step = 0 AND status IS NOT NULL"
                        ).fetchone()[0]
                except sqlite3.OperationalError:  # the store is being created
                    seen = 0
                if seen >= 8:
                    break
            time.sleep(0.05)
        assert seen >= 8, (proc.poll(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "")
        live: Any = api("/api/trajectories?step=0&limit=1000")
        steps: Any = api("/api/steps")
        assert sum(1 for t in live["items"] if t["status"]) >= 8  # the running step's rollouts, as they land
        assert [s["t_end"] for s in steps if s["step"] == 0] == [None]  # ... while the step is still running
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with sqlite3.connect(db_path) as db:
        graded = db.execute("SELECT count(*) FROM trajectories WHERE step = 0 AND status IS NOT NULL").fetchone()[0]
        with_turns = db.execute(
            "SELECT count(DISTINCT traj_id) FROM turns JOIN trajectories t ON t.id = traj_id "
            "WHERE t.step = 0 AND t.status IS NOT NULL"
        ).fetchone()[0]
        ended = db.execute("SELECT t_end FROM steps WHERE step = 0").fetchone()
    assert graded >= seen and with_turns == graded  # nothing graded was lost, turns included
    assert ended is None or ended[0] is None  # the step that was killed is not closed
