"""Torch work off the event loop leaves no OpenMP team behind (legorl/compute_thread.py).

A team that outlives its work makes libgomp shorten every spin-wait in the process, and the
in-process engine served ~35% slower for the rest of a run after its first SFT step
(docs/measured.md). These tests count the process's OS threads around the work, in a fresh
interpreter each (a team's worker threads show there, and other tests' threads do not)."""

from __future__ import annotations

import contextvars
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from legorl.compute_thread import in_own_thread

ROOT = Path(__file__).resolve().parents[2]
WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")

PRELUDE = """
import asyncio, json, os
import torch
torch.set_num_threads(2)

def os_threads():
    return len(os.listdir("/proc/self/task"))

async def settled(baseline, within_s=5.0):
    # a freed team's workers are told to exit and end a moment later: wait for them
    for _ in range(int(within_s / 0.01)):
        if os_threads() <= baseline:
            break
        await asyncio.sleep(0.01)
    return os_threads()

async def baseline_threads():
    # once the loop's default executor has its thread (in_own_thread's join waits there)
    await asyncio.to_thread(lambda: None)
    return os_threads()
"""


def counts(body: str) -> dict[str, int]:
    """Run `async def main()` (in `body`, after PRELUDE) in a fresh interpreter; its JSON."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(asyncio.run(main())))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


async def test_the_result_the_error_and_the_context_come_back():
    WHO.set("caller")
    assert await in_own_thread(lambda a, b=0: (a + b, WHO.get()), 2, b=3) == (5, "caller")

    def fails() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        await in_own_thread(fails)

    def exits() -> None:
        raise SystemExit(2)

    with pytest.raises(SystemExit):  # not swallowed by the thread: the caller decides
        await in_own_thread(exits)


def test_a_kept_thread_keeps_its_team_and_an_own_thread_leaves_none():
    got = counts(
        """
        from concurrent.futures import ThreadPoolExecutor
        from legorl.compute_thread import in_own_thread

        def parallel_work():  # kernels that open OpenMP parallel regions
            a = torch.randn(512, 512)
            return float(torch.randn(1 << 21).exp().sum() + (a @ a).sum())

        async def main():
            baseline = await baseline_threads()
            await in_own_thread(parallel_work)
            own = await settled(baseline)
            with ThreadPoolExecutor(1) as pool:  # what asyncio.to_thread does: the thread stays
                await asyncio.get_running_loop().run_in_executor(pool, parallel_work)
                kept = await settled(baseline, within_s=0.5)
            return {"baseline": baseline, "own": own, "kept": kept}
        """
    )
    assert got["own"] == got["baseline"], got
    # the executor's thread and at least one worker of its team: the premise of the fix
    assert got["kept"] >= got["baseline"] + 2, got


def test_a_gspo_step_and_its_weight_sync_leave_no_thread_behind():
    got = counts(
        """
        import argparse, dataclasses
        from legorl.engine.hf import HFEngine
        from legorl.train import minimal
        from legorl.train.config import TrainerConfig
        from legorl.train.sync import InProcessSync
        from legorl.train.trainer import Trainer
        from legorl.types import Outcome, Status

        async def main():
            engine = HFEngine("tiny-qwen3", device="cpu", dtype="float32", num_threads=2)
            try:
                trainer = Trainer(TrainerConfig(model="tiny-qwen3", lr=1e-2), weight_sync=InProcessSync(engine))
                args = argparse.Namespace(
                    prompts_per_step=1, group_size=4, prompt_len=8, new_tokens=8, target_tokens=4096, seed=0
                )
                trajs, _ = minimal.rollouts(trainer.lm, 0, args)
                trajs = [
                    dataclasses.replace(t, outcome=Outcome(r, Status.RESOLVED))
                    for t, r in zip(trajs, [1.0, 0.0, 0.5, 0.0], strict=True)
                ]
                baseline = await baseline_threads()
                await trainer.train_step(trajs)
                return {"baseline": baseline, "after": await settled(baseline), "version": engine.policy_version}
            finally:
                await engine.close()
        """
    )
    assert got["version"] == 1
    assert got["after"] == got["baseline"], got
