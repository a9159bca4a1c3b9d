"""End to end on Ray: `legorl train` for 2 steps with rollouts on a local Ray cluster of 2 worker
actors (each with its own proxy and sandboxes), the tiny hf model served from the driver over
the vLLM protocol, weights synced in-process. The run store must hold what the in-process
loop writes (tests/loop/test_loop_train.py): trajectories with turns, outcomes, metrics — and
both workers must have run rollouts, with turns stamped by the trainer's policy version."""

from __future__ import annotations

from pathlib import Path

import pytest

from legorl.store.run_store import RunStore
from tests.helpers.loop_util import train, write_run  # the same scripted agent and run as in-process


@pytest.mark.slow
def test_train_two_steps_on_ray(tmp_path: Path) -> None:
    proc = train(
        write_run(
            tmp_path,
            extra="""[ray]
enabled = true
workers = 2
num_cpus_per_worker = 0.5
""",
        )
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / "run"
    assert list((run_dir / "checkpoints").iterdir()), "no checkpoint written"

    with RunStore(run_dir, readonly=True) as store:
        listing = store.list_trajectories(limit=50)
        assert listing["total"] == 8
        items = listing["items"]
        statuses = {item["status"] for item in items}
        assert statuses <= {"resolved", "failed", "no_patch"}, statuses
        workers = {sid.split("-w")[-1].split("-")[0] for sid in (i["session_id"] for i in items)}
        assert workers == {"0", "1"}, f"rollouts did not run on both workers: {workers}"
        version = {s["step"]: s["policy_version"] for s in store.steps()}  # the trainer's, when the step began
        assert sorted(version) == [0, 1]
        for item in items:
            traj = store.load_trajectory(item["session_id"])
            turns = store.load_turns(item["session_id"])
            assert traj is not None and traj.outcome is not None and len(turns) == 2
            assert all(t.completion_ids and len(t.logprobs) == len(t.completion_ids) for t in turns)
            assert {t.policy_version for t in turns} == {version[traj.step]}  # the remote clients know it too
        history = store.metrics_history()
    assert version == {0: 0, 1: 1}  # step 0 trained, so step 1 sampled from version 1
    assert [h["step"] for h in history] == [0, 1]
    for key in ("train/loss", "reward/mean", "resolved_rate", "rollout/turns_mean", "mismatch/pearson"):
        assert all(key in h for h in history), key
