"""Group-normalised advantages: infra errors out of the statistics, zero-variance groups."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch

from legorl.train.advantages import compute_advantages, group_advantages
from legorl.types import AlignmentStats, Outcome, Segment, Status, Trajectory


def traj(
    task: str, reward: float, status: Status = Status.RESOLVED, masked: bool = False, name: str = ""
) -> Trajectory:
    seg = Segment([0], [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [0])
    return Trajectory(
        name or f"{task}-{reward}-{status}",
        [seg],
        AlignmentStats(),
        instance_id=task,
        outcome=Outcome(reward, status, masked=masked),
    )


def test_group_normalised_with_unbiased_std():
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0]
    adv = compute_advantages([traj("a", r, name=str(i)) for i, r in enumerate(rewards)], eps=0.0).values
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)
    assert adv == pytest.approx([(r - mean) / std for r in rewards], rel=1e-12)


def test_infra_errors_are_left_out_of_mean_and_std_and_get_no_advantage():
    good = [traj("a", 1.0, name="g1"), traj("a", 0.0, name="g2"), traj("a", 0.0, name="g3")]
    infra = [
        traj("a", 0.0, Status.SANDBOX_START_FAILED, name="i1"),
        traj("a", 0.0, Status.INFRA_ERROR, name="i2"),
        traj("a", 0.0, Status.FAILED, masked=True, name="m1"),
    ]
    with_infra = compute_advantages(good + infra, eps=0.0)
    alone = compute_advantages(good, eps=0.0)
    assert with_infra.values[:3] == pytest.approx(alone.values)
    assert with_infra.values[3:] == [None, None, None]
    assert with_infra.metrics["groups/masked_trajectories"] == 3
    assert with_infra.metrics["reward/mean"] == pytest.approx(1 / 3)


def test_zero_variance_groups_are_counted_and_skipped_or_kept():
    batch = [
        traj("a", 1.0, name="a1"),
        traj("a", 1.0, name="a2"),  # zero variance
        traj("b", 1.0, name="b1"),
        traj("b", 0.0, name="b2"),
        traj("c", 0.0, name="c1"),
        traj("c", 0.0, Status.ENGINE_ERROR, name="c2"),
    ]
    # group c has one valid member: no signal
    skip = compute_advantages(batch, zero_variance="skip")
    assert skip.values[0] is None and skip.values[1] is None and skip.values[4] is None
    assert skip.values[2] > 0 > skip.values[3]
    assert skip.metrics["groups/zero_variance_share"] == pytest.approx(2 / 3)
    keep = compute_advantages(batch, zero_variance="keep")
    assert keep.values[0] == 0.0 and keep.values[1] == 0.0 and keep.values[4] == 0.0
    assert keep.values[5] is None  # the infra error still gets nothing
    assert keep.metrics["groups/trained_trajectories"] == 5


def test_dr_grpo_mode_does_not_divide_by_std():
    adv = compute_advantages([traj("a", 3.0, name="x"), traj("a", 1.0, name="y")], scale_by_std=False).values
    assert adv == [1.0, -1.0]


def test_group_with_only_infra_errors_is_not_a_group():
    res = compute_advantages(
        [traj("a", 0.0, Status.GRADER_ERROR, name="x"), traj("b", 1.0, name="y"), traj("b", 0.0, name="z")]
    )
    assert res.values[0] is None
    assert res.metrics["groups/count"] == 1


def test_clear_errors_for_ungraded_or_ungrouped_trajectories():
    t = dataclasses.replace(traj("a", 1.0), outcome=None)
    with pytest.raises(ValueError, match="no outcome"):
        compute_advantages([t])
    with pytest.raises(ValueError, match="no group key"):
        compute_advantages([traj("", 1.0)])
    with pytest.raises(ValueError, match="zero_variance"):
        compute_advantages([traj("a", 1.0)], zero_variance="drop")


def test_group_advantages_tensor_form():
    adv, zero = group_advantages(
        torch.tensor([2.0, 4.0, 100.0]), torch.tensor([True, True, False]), scale_by_std=True, eps=0.0
    )
    assert not zero
    assert adv.tolist() == pytest.approx([-1 / 2**0.5, 1 / 2**0.5, 0.0])
