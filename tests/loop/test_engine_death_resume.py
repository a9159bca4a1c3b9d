"""Losing the engine does not cost a step (issue 39, item 5), against a real `legorl train`
over a real HTTP engine (`legorl engine-serve`, the vLLM protocol).

The engine is killed as step 1 begins: every rollout of that step is masked for
`engine_error`. Before the fix the step was trained on nothing, checkpointed as done, and
`--resume` never redid it. Now the step is neither trained nor checkpointed (one line says
so); with the engine back, `--resume` re-runs step 1, whose lost rollouts are kept as
abandoned, out of its group.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx

from legorl.models import resolve_model
from tests.helpers.loop_util import one_call_agent

LEGORL = [sys.executable, "-m", "legorl.cli"]
KEY = "engine-death-test-key"
AGENT = one_call_agent(max_tokens=4, sleep_s=2)
CONFIG = """
[run]
dir = "{dir}"
tasks = "quickstart-calc"
steps = 2
tasks_per_step = 1
group_size = 2
[calc_tasks]
train = 8
heldout = 4
[engine]
kind = "vllm"
model = "quickstart-qwen3"
served_model_name = "{served}"
served_model_dir = "{served}"
url = "http://127.0.0.1:{port}"
api_key = "{key}"
request_timeout_s = 20
[sandbox]
retries = 0
[proxy]
max_tokens = 4
[harness]
name = "command"
command_file = "{agent}"
[trainer]
model = "quickstart-qwen3"
lr = 1e-5
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(served: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [*LEGORL, "engine-serve", "--engine", "hf", "--model", str(served), "--port", str(port), "--api-key", KEY],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code < 500:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError(f"engine-serve did not come up (exit {proc.poll()})")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True) as db:
        return list(db.execute(sql))


def test_a_step_the_engine_died_under_is_redone_on_resume(tmp_path: Path) -> None:
    served = tmp_path / "served"
    shutil.copytree(resolve_model("quickstart-qwen3"), served)
    port = free_port()
    run_dir = tmp_path / "run"
    (tmp_path / "agent.sh").write_text(AGENT)
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(dir=run_dir, served=served, port=port, key=KEY, agent=tmp_path / "agent.sh"))
    engine = serve(served, port)
    try:
        run = subprocess.Popen(
            [*LEGORL, "train", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and run.poll() is None:
            try:
                if rows(run_dir, "SELECT count(*) FROM steps WHERE step = 1")[0][0]:
                    break
            except sqlite3.OperationalError:
                pass
            time.sleep(0.05)
        stop(engine)  # as step 1's agents think: every model call of the step fails
        _, err = run.communicate(timeout=300)
    finally:
        stop(engine)
    stderr = err.decode()
    assert run.returncode == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert "step 1: 2 of 2 rollouts were lost to the engine" in stderr and "--resume" in stderr, stderr[-2000:]
    assert not (run_dir / "checkpoints" / "step_00000002").exists()  # not checkpointed as done
    assert rows(run_dir, "SELECT t_end FROM steps WHERE step = 1") == [(None,)]
    assert rows(run_dir, "SELECT count(*) FROM metrics WHERE step = 1 AND key = 'train/loss'") == [(0,)]

    engine = serve(served, port)
    try:
        again = subprocess.run(
            [*LEGORL, "train", str(config), "--resume"], capture_output=True, text=True, timeout=600, check=False
        )
    finally:
        stop(engine)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed at step 1 (2 rollouts of the interrupted attempt kept as abandoned)" in again.stderr
    redone = rows(run_dir, "SELECT status, masked FROM trajectories WHERE step = 1")
    assert len(redone) == 2 and not any(masked for _, masked in redone), redone  # the step's own, with an engine
    assert rows(run_dir, "SELECT count(*) FROM flags WHERE flag = 'abandoned'") == [(2,)]
    assert (run_dir / "checkpoints" / "step_00000002").is_dir()
