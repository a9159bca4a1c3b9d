"""End to end: `legorl train` for 2 steps (tiny hf model, command harness, local sandboxes),
then `legorl ui` serves the run directory with its trajectories, outcomes and metrics."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from legorl.tasks.loader import load_shipped

ROOT = Path(__file__).resolve().parents[1]
LEGORL = [sys.executable, "-m", "legorl.cli"]

AGENT = """#!/bin/bash
# A scripted agent: asks the policy twice through the proxy (OpenAI dialect), then
# applies the known fix in half of its runs, so a group has reward variance.
python3 - <<'PY'
import json, os, urllib.request
base = os.environ["OPENAI_BASE_URL"]
msgs = [{"role": "user", "content": open(os.environ["LEGORL_PROBLEM_FILE"]).read()[:400]}]
for _ in range(2):
    body = {"model": "policy", "messages": msgs, "max_tokens": 12}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    reply = json.load(urllib.request.urlopen(req, timeout=120))
    msgs += [reply["choices"][0]["message"], {"role": "user", "content": "continue"}]
PY
if [ $((RANDOM % 2)) -eq 0 ]; then
git apply <<'PATCH'
__PATCH__PATCH
fi
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_train_two_steps_then_ui(tmp_path: Path) -> None:
    task = load_shipped("train")[0]
    (tmp_path / "agent.sh").write_text(AGENT.replace("__PATCH__", task.patch if task.patch.endswith("\n") else task.patch + "\n"))
    (tmp_path / "run.toml").write_text(f"""
[run]
dir = "run"
tasks = "shipped"
split = "train"
steps = 2
tasks_per_step = 1
group_size = 4
max_concurrent_rollouts = 4
[engine]
kind = "hf"
model = "tiny-qwen3"
[proxy]
max_tokens = 12
[sandbox]
agent_timeout_s = 180
[harness]
name = "command"
command_file = "agent.sh"
[trainer]
lr = 1e-4
zero_variance_groups = "keep"  # train every step even if a group's rewards happen to be equal
""")
    proc = subprocess.run([*LEGORL, "train", str(tmp_path / "run.toml")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "run"
    assert (run_dir / "run.sqlite").exists()
    assert list((run_dir / "checkpoints").iterdir()), "no checkpoint written"

    port = _free_port()
    ui = subprocess.Popen([*LEGORL, "ui", "--run", str(run_dir), "--port", str(port)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(base + "/api/run", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        listing = httpx.get(base + "/api/trajectories", params={"limit": 50}, timeout=10).json()
        assert listing["total"] == 8
        statuses = {item["status"] for item in listing["items"]}
        assert statuses <= {"resolved", "failed", "no_patch"}, statuses
        one = httpx.get(base + f"/api/trajectories/{listing['items'][0]['session_id']}", timeout=10).json()
        assert len(one["turns"]) == 2 and one["outcome"]["status"] in statuses
        metrics = httpx.get(base + "/api/metrics", timeout=10).json()
        text = json.dumps(metrics)
        for key in ("train/loss", "reward/mean", "resolved_rate", "rollout/turns_mean", "mismatch/pearson"):
            assert key in text, key
    finally:
        ui.terminate()
        ui.wait(10)
