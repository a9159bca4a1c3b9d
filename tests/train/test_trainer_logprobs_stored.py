"""The trainer's recomputed logprobs reach the run store for every trained trajectory of a
real `legorl train` run (issue 38 item 5), bounded by `[monitor] trainer_logprobs_max_tokens`.

Checked on the store of the tiny real run the loop tests use: every policy turn of every
trained trajectory has trainer logprobs, one per completion token, equal to the rollout's
within the engine/trainer numerics of one CPU model (the run's own `mismatch/pearson` says
they agree); with the budget at 0 none are stored, and with a small budget only that many.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch

from legorl.store.run_store import RunStore
from legorl.train.batch import pack
from legorl.train.kept_logprobs import KeptLogprobs, split_segments
from legorl.types import AlignmentStats, Segment, Trajectory
from tests.helpers.loop_util import train, write_run


def _seg(n: int, sampled_from: int) -> Segment:
    mask = [0] * sampled_from + [1] * (n - sampled_from)
    return Segment([0], list(range(3, 3 + n)), mask, [-0.5 * m for m in mask], [0])


def test_a_packed_row_is_cut_back_into_each_trajectorys_segments() -> None:
    a = Trajectory("a", [_seg(5, 2), _seg(4, 3)], AlignmentStats(), instance_id="t")
    b = Trajectory("b", [_seg(6, 1)], AlignmentStats(), instance_id="t")
    (mb,) = pack([(0, a, 1.0), (1, b, -1.0)], "trajectory", 100)
    logprobs_N = -torch.arange(mb.num_tokens, dtype=torch.float32) * mb.mask_N  # 0 where not sampled
    got = {(t, s): lp for t, s, lp in split_segments(mb, logprobs_N)}
    assert sorted(got) == [(0, 0), (0, 1), (1, 0)]
    for (t, s), lp_T in got.items():
        traj = (a, b)[t]
        seg = traj.segments[s]
        assert len(lp_T) == len(seg.token_ids) and lp_T[0] == 0
        sampled = np.array(seg.loss_mask, dtype=bool)
        assert (lp_T[sampled] < 0).all() and (lp_T[~sampled] == 0).all()  # each sampled token, nothing else
    kept = KeptLogprobs(max_tokens=10)
    kept.add(mb, logprobs_N)
    assert kept.tokens <= 10 and kept.dropped == 3 - len(kept.segments)


def _turn_rows(run: Path) -> list[tuple[int, bytes | None, int]]:
    with sqlite3.connect(f"file:{run / 'run.sqlite'}?mode=ro", uri=True) as db:
        return db.execute(
            "SELECT t.advantage IS NOT NULL, u.trainer_logprobs, u.n_completion FROM turns u "
            "JOIN trajectories t ON t.id = u.traj_id WHERE u.side_call = 0"
        ).fetchall()


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("kept")
    proc = train(write_run(tmp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


def test_every_trained_trajectory_has_the_trainers_logprobs(stored: Path) -> None:
    rows = _turn_rows(stored)
    trained = [r for r in rows if r[0]]
    assert trained and all(r[1] is not None for r in trained), "a trained turn without trainer logprobs"
    with RunStore(stored, readonly=True) as store:
        sessions = [t["session_id"] for t in store.list_trajectories(limit=100)["items"] if t["advantage"] is not None]
        history = store.metrics_history()
        for sid in sessions:
            view = store.get_trajectory(sid)
            assert view is not None and view["untrained"] is None
            for turn in view["turns"]:
                lp, tr = np.array(turn["logprobs"]), np.array(turn["trainer_logprobs"])
                assert len(tr) == turn["n_completion"] == len(lp)
                assert np.abs(lp - tr).max() < 1e-3  # one CPU model on both sides
    assert all(h.get("store/trainer_logprobs_segments", 0) > 0 for h in history if h.get("train/trained"))
    assert all(h.get("store/trainer_logprobs_failed", 0) == 0 for h in history if "store/trainer_logprobs_failed" in h)


@pytest.mark.parametrize("budget", [0, 500])  # a segment here is ~220 tokens: 2 of 4 fit
def test_the_budget_bounds_what_is_stored(tmp_path: Path, budget: int) -> None:
    proc = train(write_run(tmp_path, extra=f"[monitor]\ntrainer_logprobs_max_tokens = {budget}\n"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _turn_rows(tmp_path / "run")
    with_lp = [r for r in rows if r[1] is not None]
    with RunStore(tmp_path / "run", readonly=True) as store:
        history = [h for h in store.metrics_history() if h.get("train/trained")]
    if budget == 0:
        assert not with_lp and not any("store/trainer_logprobs_tokens" in h for h in history)
    else:
        assert 0 < len(with_lp) < len(rows)
        assert all(h["store/trainer_logprobs_tokens"] <= budget for h in history)
        assert all(h["store/trainer_logprobs_over_budget"] > 0 for h in history)
