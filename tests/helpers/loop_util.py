"""Shared scaffolding of the end-to-end `legorl train` tests (in-process, on Ray, under
torchrun): one scripted command agent and one run config around it, so that the runs
differ only in how they are launched and what they check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from legorl.tasks.loader import load_shipped

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


def one_call_agent(max_tokens: int, sleep_s: int = 0) -> str:
    """A scripted agent making one model call through the proxy (enough for a trajectory with
    sampled tokens), after `sleep_s` seconds: a pause that leaves time to act on a live run."""
    pause = f"sleep {sleep_s}\n" if sleep_s else ""
    return f"""#!/bin/bash
{pause}python3 - <<'PY'
import json, os, urllib.request
body = {{"model": "policy", "messages": [{{"role": "user", "content": "fix calc.py"}}], "max_tokens": {max_tokens}}}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                             headers={{"content-type": "application/json"}})
urllib.request.urlopen(req, timeout=120).read()
PY
"""


def write_run(tmp_path: Path, *, group_size: int = 4, max_tokens: int = 12, extra: str = "") -> Path:
    """Write `agent.sh` (AGENT with the first training task's fix) and `run.toml` (2 steps of
    one task, the tiny hf model, the command harness; `extra`: more TOML tables) into
    `tmp_path`; the config's path."""
    task = load_shipped("train")[0]
    (tmp_path / "agent.sh").write_text(AGENT.replace("__PATCH__", task.patch.rstrip("\n") + "\n"))
    config = tmp_path / "run.toml"
    config.write_text(f"""
[run]
dir = "run"
tasks = "shipped"
split = "train"
steps = 2
tasks_per_step = 1
group_size = {group_size}
max_concurrent_rollouts = 4
[engine]
kind = "hf"
model = "tiny-qwen3"
[proxy]
max_tokens = {max_tokens}
[sandbox]
agent_timeout_s = 180
[harness]
name = "command"
command_file = "agent.sh"
[trainer]
lr = 1e-4
zero_variance_groups = "keep"  # train every step even if a group's rewards happen to be equal
{extra}""")
    return config


def train(config: Path, launcher: list[str] = LEGORL) -> subprocess.CompletedProcess[str]:
    """`<launcher> train <config>` in the config's directory, output captured."""
    return subprocess.run(
        [*launcher, "train", str(config)], cwd=config.parent, capture_output=True, text=True, timeout=900, check=False
    )


def calc_warm_start_config(
    run_dir: Path, agent: Path, *, heldout: int, run: str = "", engine: str = "", trainer: str = ""
) -> str:
    """The smallest run through every phase: one GSPO step of one calc task through the
    `command` harness (`agent`) on the tiny hf model, a warm start by the quickstart's
    demonstrator with its control, and held-out evaluations after the warm start and at the
    end. `run`, `engine`, `trainer`: more lines for those tables."""
    return f"""
[run]
dir = "{run_dir}"
tasks = "quickstart-calc"
steps = 1
tasks_per_step = 1
group_size = 2
{run}
[calc_tasks]
train = 8
heldout = 4
[heldout]
tasks = {heldout}
at = ["warm_start", "end"]
[engine]
kind = "hf"
model = "quickstart-qwen3"
{engine}
[proxy]
max_tokens = 4
[harness]
name = "command"
command_file = "{agent}"
[trainer]
model = "quickstart-qwen3"
lr = 1e-5
{trainer}
[warm_start]
episodes = 2
steps = 2
batch_size = 2
warmup_steps = 0
control_steps = 2
[warm_start.engine]
kind = "quickstart-expert"
model = "quickstart-qwen3"
"""
