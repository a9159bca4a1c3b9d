"""`--resume` keeps everything once (issue 39, item 4), against a real `legorl train`.

One run with a warm start, its control and held-out evaluations after the warm start and
at the end, SIGKILLed while the end evaluation is midway (one of its rollouts graded, the
others not). Before the fix the resume dropped the control (no row, no rollouts, exit 0)
and kept the killed evaluation's rollouts beside the redone ones (the end evaluation
counted twice). Now the partial ones are kept as abandoned, out of the results, the end
evaluation counts its tasks once, and the control runs from the warm start as the
uninterrupted run would have.
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

from legorl.loop.report import RESULTS_FILE, is_complete
from tests.helpers.loop_util import calc_warm_start_config, one_call_agent

LEGORL = [sys.executable, "-m", "legorl.cli"]
HELDOUT = 3
AGENT = one_call_agent(max_tokens=4, sleep_s=1)


def _count(run_dir: Path, sql: str) -> int:
    try:
        with sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True) as db:
            return int(db.execute(sql).fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The run, killed once the end evaluation has graded 1 of its 3 rollouts, then resumed;
    its directory and the resume's stderr."""
    root = tmp_path_factory.mktemp("keeps_once")
    (root / "agent.sh").write_text(AGENT)
    config = root / "run.toml"
    config.write_text(
        calc_warm_start_config(root / "run", root / "agent.sh", heldout=HELDOUT, run="max_concurrent_rollouts = 1")
    )
    run_dir = root / "run"
    graded_end = "SELECT count(*) FROM trajectories WHERE session_id LIKE 'eval-end-%' AND status IS NOT NULL"
    proc = subprocess.Popen(
        [*LEGORL, "train", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None and _count(run_dir, graded_end) < 1:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else proc.returncode
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    killed_with = _count(run_dir, "SELECT count(*) FROM trajectories WHERE session_id LIKE 'eval-end-%'")
    assert 1 <= killed_with < HELDOUT, killed_with  # midway
    assert (run_dir / RESULTS_FILE).exists() and not is_complete(run_dir)  # its warm start's row, not an end
    again = subprocess.run(
        [*LEGORL, "train", str(config), "--resume"], capture_output=True, text=True, timeout=600, check=False
    )
    assert again.returncode == 0, again.stderr[-3000:]
    return run_dir, again.stderr


def _eval_rows(run_dir: Path, phase: str) -> tuple[int, int]:
    """(kept, abandoned) rollouts of one held-out evaluation."""
    like = f"eval-{phase}-%"
    kept = _count(run_dir, f"SELECT count(*) FROM trajectories WHERE session_id LIKE '{like}' AND step = -2")
    gone = _count(
        run_dir,
        f"SELECT count(*) FROM trajectories t JOIN flags f ON f.traj_id = t.id "
        f"WHERE t.session_id LIKE '{like}' AND t.step IS NULL AND f.flag = 'abandoned'",
    )
    return kept, gone


def test_a_held_out_evaluation_killed_midway_counts_once(resumed: tuple[Path, str]) -> None:
    run_dir, stderr = resumed
    kept, gone = _eval_rows(run_dir, "end")
    assert kept == HELDOUT and gone >= 1, (kept, gone)  # redone once; the partial attempt kept as abandoned
    assert _eval_rows(run_dir, "warm_start") == (HELDOUT, 0)  # finished before the checkpoint: kept as it was
    report = json.loads((run_dir / "heldout_results.json").read_text())["evaluations"]
    assert report["end"]["episodes"] == HELDOUT, report
    assert _count(run_dir, "SELECT count(*) FROM metrics WHERE key = 'heldout/end/episodes'") == 1
    assert _count(run_dir, "SELECT count(*) FROM metrics WHERE key = 'heldout/warm_start/episodes'") == 1
    assert "resumed at step 1" in stderr and "kept as abandoned" in stderr, stderr[-2000:]


def test_the_control_survives_a_resume(resumed: tuple[Path, str]) -> None:
    run_dir, stderr = resumed
    report = json.loads((run_dir / "heldout_results.json").read_text())
    assert set(report["evaluations"]) == {"warm_start", "end", "control"}, report["evaluations"]
    assert report["complete"] is True and is_complete(run_dir)
    assert "control_over_warm_start" in report["gains"], report["gains"]
    assert _eval_rows(run_dir, "control") == (HELDOUT, 0)
    assert "warm start:" not in stderr  # the demonstrations and the SFT were not redone
