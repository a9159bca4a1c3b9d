"""Packing recorded trajectories: shifted targets, per-segment positions, units, routing rows."""

from __future__ import annotations

import pytest
import torch

from legorl.train.batch import count_units, pack, split_balanced
from legorl.types import AlignmentStats, Outcome, Segment, Status, Trajectory


def seg(ids, mask, versions=(0,), routing=None, turns=None):
    lps = [-(i + 1) / 10 if m else 0.0 for i, m in enumerate(mask)]
    return Segment(list(turns or range(len(versions))), list(ids), list(mask), lps, list(versions), routing)


def traj(name, *segments, task="t"):
    return Trajectory(name, list(segments), AlignmentStats(), instance_id=task, outcome=Outcome(1.0, Status.RESOLVED))


def test_targets_are_shifted_and_positions_restart_per_segment():
    a = seg([10, 11, 12, 13, 14], [0, 0, 1, 1, 0])
    b = seg([20, 21, 22], [0, 1, 1])
    (mb,) = pack([(0, traj("x", a, b), 0.5)], "trajectory", 100)
    assert mb.input_ids_N.tolist() == [10, 11, 12, 13, 14, 20, 21, 22]
    assert mb.position_ids_N.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert mb.targets_N.tolist() == [11, 12, 13, 14, 0, 21, 22, 0]
    assert mb.mask_N.tolist() == [0, 1, 1, 0, 0, 1, 1, 0]  # no loss across the segment boundary
    assert mb.rollout_logprobs_N.tolist() == pytest.approx([0, -0.3, -0.4, 0, 0, -0.2, -0.3, 0])
    assert mb.advantages_N.tolist() == [0.5] * 8
    assert mb.segment_lengths == [5, 3]


@pytest.mark.parametrize(("unit", "expected_units", "live"), [("trajectory", 1, 1), ("segment", 2, 2), ("turn", 3, 3)])
def test_sequence_units(unit, expected_units, live):
    a = seg([1, 2, 3, 4, 5, 6, 7], [0, 1, 1, 0, 0, 1, 0], versions=(0, 0))  # two turns
    b = seg([8, 9, 10], [0, 1, 1])
    (mb,) = pack([(0, traj("x", a, b), 1.0)], unit, 100)
    assert mb.num_units == expected_units
    assert count_units(mb) == live
    sampled_units = mb.unit_ids_N[mb.mask_N > 0].tolist()
    if unit == "turn":
        assert sampled_units == [0, 0, 1, 2, 2]
    elif unit == "segment":
        assert sampled_units == [0, 0, 0, 1, 1]


def test_trajectories_are_never_split_and_first_fit_decreasing_packs_them():
    items = [(i, traj(str(i), seg(list(range(n)), [0] + [1] * (n - 1))), 1.0) for i, n in enumerate([6, 3, 5, 2])]
    mbs = pack(items, "trajectory", 8)
    assert sorted(mb.num_tokens for mb in mbs) == [8, 8]  # 6+2, 5+3
    for mb in mbs:
        for t in mb.traj_ids_N.unique().tolist():
            assert (mb.traj_ids_N == t).sum() == [6, 3, 5, 2][t]
    big = pack([(0, traj("big", seg(list(range(20)), [0] + [1] * 19)), 1.0)], "trajectory", 8)
    assert [mb.num_tokens for mb in big] == [20]  # alone, over budget


def test_routing_rows_one_short_are_padded_with_no_expert():
    routing = [[[layer, layer + 1] for layer in range(3)] for _ in range(3)]  # 3 rows for 4 tokens, 3 layers, k=2
    (mb,) = pack([(0, traj("x", seg([1, 2, 3, 4], [0, 0, 1, 1], routing=routing)), 1.0)], "trajectory", 100)
    assert mb.replay_N_L_K.shape == (4, 3, 2)
    assert mb.replay_N_L_K[3].tolist() == [[-1, -1]] * 3
    with pytest.raises(ValueError, match="routed_experts has 2 rows for 4 tokens"):
        pack([(0, traj("x", seg([1, 2, 3, 4], [0, 0, 1, 1], routing=routing[:2])), 1.0)], "trajectory", 100)


def test_policy_versions_per_turn_map_onto_each_turns_tokens():
    a = seg([1, 2, 3, 4, 5, 6], [0, 1, 1, 0, 1, 1], versions=(3, 5))
    (mb,) = pack([(0, traj("x", a), 1.0)], "trajectory", 100)
    assert mb.versions_N[mb.mask_N > 0].tolist() == [3, 3, 5, 5]
    # a turn that sampled nothing: runs cannot be matched, the oldest version is used
    b = seg([1, 2, 3, 4], [0, 1, 1, 0], versions=(3, 5))
    (mb,) = pack([(0, traj("y", b), 1.0)], "trajectory", 100)
    assert mb.versions_N[mb.mask_N > 0].tolist() == [3, 3]


def test_bad_segments_fail_with_a_clear_message():
    with pytest.raises(ValueError, match="loss_mask\\[0\\] is 1"):
        pack([(0, traj("x", seg([1, 2], [1, 1])), 1.0)], "trajectory", 10)
    bad = seg([1, 2, 3], [0, 1, 1])
    bad.logprobs = bad.logprobs[:2]
    with pytest.raises(ValueError, match="equal lengths"):
        pack([(0, traj("x", bad), 1.0)], "trajectory", 10)
    with pytest.raises(ValueError, match="policy_versions"):
        pack([(0, traj("x", seg([1, 2, 3], [0, 1, 1], versions=(1, 2, 3, 4, 5), turns=[0])), 1.0)], "trajectory", 10)


def test_trajectory_without_sampled_tokens_is_dropped():
    assert pack([(0, traj("x", seg([1, 2, 3], [0, 0, 0])), 1.0)], "trajectory", 10) == []


def test_split_balanced_gives_every_micro_batch_to_exactly_one_rank():
    items = [(i, traj(str(i), seg(list(range(n)), [0] + [1] * (n - 1))), 1.0) for i, n in enumerate([9, 7, 5, 4, 3])]
    mbs = pack(items, "trajectory", 9)
    parts = split_balanced(mbs, 2)
    assert sorted(id(m) for p in parts for m in p) == sorted(id(m) for m in mbs)
    loads = [sum(m.num_tokens for m in p) for p in parts]
    assert max(loads) - min(loads) <= 9
    moved = mbs[0].to("cpu")
    assert torch.equal(moved.input_ids_N, mbs[0].input_ids_N)
