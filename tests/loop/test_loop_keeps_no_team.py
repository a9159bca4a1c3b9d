"""A whole `legorl train` leaves no OpenMP team behind (legorl/compute_thread.py), against a
real run: warm start, its control, a KL reference, a GSPO step, held-out evaluations.

A thread that opens a parallel torch region keeps a team of worker threads for its life; the
event loop's own thread lives as long as the run. One kept team beside the engine's made
libgomp cut its spin-wait, and the engine served ~1.4x slower from then on (docs/measured.md:
the control's start written with `torch.save` on the event loop did it in a real run). A
team's workers are native threads (not Python's): the run is counted by those, before and
after, in a fresh interpreter with the tokenizer's own thread pool off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.loop_util import calc_warm_start_config, one_call_agent
from tests.helpers.paths import ROOT

SCRIPT = """
import asyncio, json, os, threading, time
from pathlib import Path
import torch
torch.set_num_threads(2)
from legorl.loop.config import load_run_config
from legorl.loop.train import train

def native():
    python = {t.native_id for t in threading.enumerate()}
    return sum(1 for t in os.listdir("/proc/self/task") if int(t) not in python)

def settled(limit):
    for _ in range(500):  # a freed team's workers end a moment after they are told to
        if native() <= limit:
            break
        time.sleep(0.01)
    return native()

cfg = load_run_config(Path(os.environ["RUN_CONFIG"]))
before = native()
summary = asyncio.run(train(cfg, overwrite=True))
after = settled(before)
torch.randn(1 << 21).exp().sum()  # a parallel region on this (the loop's) thread: the probe's premise
probe = native()
print(json.dumps({"before": before, "after": after, "probe": probe, "steps": len(summary["steps"])}))
"""


def test_a_run_leaves_no_openmp_team_on_any_thread(tmp_path: Path) -> None:
    agent = tmp_path / "agent.sh"
    agent.write_text(one_call_agent(max_tokens=4))
    config = tmp_path / "run.toml"
    config.write_text(
        calc_warm_start_config(
            tmp_path / "run",
            agent,
            heldout=2,
            run="max_concurrent_rollouts = 2",
            engine="num_threads = 2",
            trainer="kl_coef = 0.1",
        )
    )
    env = {**os.environ, "RUN_CONFIG": str(config), "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["steps"] == 1, got
    # the engine's team ended with its thread; the trainer's calls with theirs: no worker is left
    assert got["after"] <= got["before"], got
    assert got["probe"] > got["after"], got  # a kept team does show in this count
