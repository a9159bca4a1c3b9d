"""`legorl status`: on a real `legorl train` run's store (finished, and live), and on copies of
that store made sick on purpose through the store's own API, one per failure signature.

The healthy run is the tiny one the loop tests use (tiny hf model, command harness, local
sandboxes; ~10 s). Each sick store is that run's store plus three more steps of metrics,
written with `RunStore.log_metrics` as the loop writes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from legorl.ops.liveness import lock_path
from legorl.ops.status import NO_MATCH, StatusError, status
from legorl.store.run_store import RunStore
from tests.helpers.loop_util import LEGORL, train, write_run
from tests.helpers.sick_runs import SICK, copy_store, sick_store


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step `legorl train` run."""
    tmp = tmp_path_factory.mktemp("healthy")
    proc = train(write_run(tmp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


def cli(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEGORL, "status", *map(str, args)], capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------ healthy, finished
def test_a_finished_healthy_run(healthy: Path) -> None:
    db = healthy / "run.sqlite"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    p = cli(healthy, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # read-only
    assert r["state"] == "finished" and r["run_id"]
    assert r["process"]["state"] in ("not running", "unknown")
    prog = r["progress"]
    assert prog["step"] == 1 and prog["steps_done"] == 2 and prog["steps_planned"] == 2
    assert prog["minutes_per_step"] > 0 and prog["elapsed_s"] > 0 and prog["last_write"].endswith("Z")
    assert r["sick"] is False and r["signatures"] == [] and r["summary"] == NO_MATCH
    text = cli(healthy)
    assert text.returncode == 0 and NO_MATCH in text.stdout and "2/2 steps done" in text.stdout


# ------------------------------------------------------------------ sick on purpose
@pytest.mark.parametrize("key", sorted(SICK))
def test_each_signature_on_a_store_made_sick(healthy: Path, tmp_path: Path, key: str) -> None:
    run = sick_store(healthy, tmp_path / key, SICK[key])
    r = status(run)
    assert [m["key"] for m in r["signatures"]] == [key], r["signatures"]
    (m,) = r["signatures"]
    assert r["sick"] and r["verdict"] == "SICK" and m["evidence"] and m["fix"]
    assert all("step" in e or "min" in e for e in m["evidence"])


def test_the_evidence_is_what_was_read(healthy: Path, tmp_path: Path) -> None:
    r = status(sick_store(healthy, tmp_path / "m", SICK["mismatch"]))
    assert any("0.75" in e and "step 4" in e for e in r["signatures"][0]["evidence"])
    lr = cli(sick_store(healthy, tmp_path / "lr", SICK["lr_zero"]))
    assert lr.returncode == 0
    assert (
        "SICK: learning rate 0" in lr.stdout and "read: train/lr:" in lr.stdout and "step 3: 0, step 4: 0" in lr.stdout
    )


def test_a_run_before_its_first_step_reads(tmp_path: Path) -> None:
    """A store the loop has opened but not yet stepped (held-out or warm start still running)."""
    with RunStore(tmp_path / "early", config={"run": {"steps": 3}}) as store:
        store.log_metrics(-1, {"sft/loss": 1.0})
    r = status(tmp_path / "early")
    assert r["progress"]["step"] is None and r["progress"]["steps_done"] == 0 and r["signatures"] == []
    p = cli(tmp_path / "early")
    assert p.returncode == 0 and "no GSPO step yet: 0/3 steps done" in p.stdout and NO_MATCH in p.stdout


def test_a_schedule_that_ends_at_zero_with_the_run_is_no_lr_signature(healthy: Path, tmp_path: Path) -> None:
    """The logged lr is the next step's: a cosine ending with the run logs 0 on its last step."""
    run = copy_store(healthy, tmp_path / "cosine")
    with RunStore(run) as store:
        store.log_metrics(1, {"train/lr": 0.0})  # step 1 of 2: the last planned one
    assert status(run)["signatures"] == []


@pytest.fixture
def legorl_sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose command line says legorl (as a run's does)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "legorl-train-stand-in"])
    yield p
    p.kill()
    p.wait()


def test_a_stall_is_an_alive_run_that_stopped_writing(
    healthy: Path, tmp_path: Path, legorl_sleeper: subprocess.Popen[bytes]
) -> None:
    run = copy_store(healthy, tmp_path / "stalled")
    lock = lock_path(run)
    if lock is None:
        pytest.skip("this legorl writes no run-directory lock")
    lock.write_text(f"{legorl_sleeper.pid}\n")
    hour_ago = time.time() - 3600
    for f in run.glob("run.sqlite*"):
        os.utime(f, (hour_ago, hour_ago))
    r = status(run)
    assert r["state"] == "running" and r["process"] == {**r["process"], "state": "alive", "pid": legorl_sleeper.pid}
    assert [m["key"] for m in r["signatures"]] == ["stall"]
    assert "60 min ago" in r["signatures"][0]["evidence"][0]
    assert status(run, stall_after_s=7200)["signatures"] == []  # within the limit: no stall
    legorl_sleeper.kill()
    legorl_sleeper.wait()
    gone = status(run)
    assert gone["process"]["state"] == "not running" and gone["state"] == "finished" and not gone["signatures"]


# ------------------------------------------------------------------ killed after an evaluation
def test_a_run_killed_after_its_first_evaluation_is_not_finished(healthy: Path, tmp_path: Path) -> None:
    """The report is rewritten after every evaluation, so a run killed after its start
    evaluation has one; only its `complete` (or an older report's end-of-run wall time)
    says the run ended."""
    run = copy_store(healthy, tmp_path / "run")
    report = run / "heldout_results.json"
    row = {"label": "start", "resolved": 0, "episodes": 4, "masked": 0, "wall_s": 1.0, "statuses": {}}
    partial = {"evaluations": {"start": row}, "gains": {}, "phases_s": {"eval_start": 1.0}}
    report.write_text(json.dumps({**partial, "complete": False}))
    assert status(run)["state"] in ("stopped", "unknown")
    report.write_text(json.dumps(partial))  # written by a loop that recorded no `complete`
    assert status(run)["state"] in ("stopped", "unknown")
    report.write_text(json.dumps({**partial, "wall_s": 9.0}))  # such a loop's end-of-run write
    assert status(run)["state"] == "finished"
    report.write_text(json.dumps({**partial, "complete": True, "wall_s": 9.0}))
    assert status(run)["state"] == "finished"


# ------------------------------------------------------------------ live
def test_status_of_a_live_run(tmp_path: Path) -> None:
    config = write_run(tmp_path)
    config.write_text(config.read_text().replace("steps = 2", "steps = 5"))
    proc = subprocess.Popen(
        [*LEGORL, "train", str(config)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen: dict[str, Any] | None = None
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            try:
                r = status(tmp_path / "run")
            except StatusError:  # not created yet
                r = None
            if r is not None and r["progress"]["steps_done"] >= 1 and proc.poll() is None:
                seen = r
                break
            time.sleep(0.2)
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert seen is not None, "never saw the run between its first step and its end"
    assert seen["progress"]["steps_planned"] == 5 and seen["progress"]["steps_done"] < 5
    if lock_path(tmp_path / "run") is not None:
        assert seen["state"] == "running" and seen["process"]["pid"] == proc.pid
    after = status(tmp_path / "run")
    assert after["state"] == "finished" and after["progress"]["steps_done"] == 5
    assert after["process"]["state"] != "alive"


# ------------------------------------------------------------------ bad input
def test_a_directory_without_a_run_is_one_line(tmp_path: Path) -> None:
    p = cli(tmp_path)
    assert p.returncode != 0 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "holds no run" in p.stderr


def test_a_corrupt_store_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "run.sqlite").write_bytes(b"this is not a database" * 400)
    p = cli(tmp_path, "--json")
    assert p.returncode != 0 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "run.sqlite" in p.stderr


def test_a_store_locked_by_a_writer_is_one_line(healthy: Path, tmp_path: Path) -> None:
    run = copy_store(healthy, tmp_path / "locked")
    holder = sqlite3.connect(run / "run.sqlite", isolation_level=None)
    try:
        holder.execute("PRAGMA journal_mode=DELETE")
        holder.execute("BEGIN EXCLUSIVE")
        t0 = time.monotonic()
        p = cli(run)
        assert time.monotonic() - t0 < 60
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert p.returncode != 0 and p.stderr.strip().count("\n") == 0 and "locked" in p.stderr
