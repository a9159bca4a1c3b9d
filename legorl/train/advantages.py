"""Group-normalised outcome advantages (GRPO/GSPO), with infrastructure failures left out.

A group is the trajectories of one task in one step. Â_i = (R_i - mean_G R) / (std_G R + eps)
(or without the std for Dr.GRPO), where mean and std run over the group's *valid*
trajectories only: a trajectory whose outcome is masked or has an infrastructure status
never counts as a reward of 0 for its siblings, and gets no advantage itself.

A group whose valid rewards are all equal (or that has a single valid member) carries no
learning signal; it is counted (`groups/zero_variance_share`) and either skipped (nothing
of it is trained, saving its compute) or kept with advantage 0 (it then still counts in
sequence-mean denominators, which shrinks the step: the config decides).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from legorl.types import Trajectory

ZERO_VARIANCE_TOL = 1e-12


def is_valid(traj: Trajectory) -> bool:
    """True when the trajectory's outcome may be trained on (graded, not an infra fault)."""
    if traj.outcome is None:
        raise ValueError(f"trajectory {traj.session_id!r} has no outcome: grade it before training on it")
    return not (traj.outcome.masked or traj.outcome.status.is_infra)


def group_advantages(
    rewards_G: torch.Tensor, valid_G: torch.Tensor, *, scale_by_std: bool, eps: float
) -> tuple[torch.Tensor, bool]:
    """Advantages of one group (0 where invalid) and whether the group has zero variance.

    The std is the unbiased sample std, as in verl and TRL.
    """
    rewards_G = rewards_G.to(torch.float64)
    adv_G = torch.zeros_like(rewards_G)
    valid = rewards_G[valid_G]
    if valid.numel() < 2 or float(valid.max() - valid.min()) <= ZERO_VARIANCE_TOL:
        return adv_G, True
    centred = valid - valid.mean()
    if scale_by_std:
        centred = centred / (valid.std(correction=1) + eps)
    adv_G[valid_G] = centred
    return adv_G, False


@dataclass
class Advantages:
    """Per-trajectory advantage (None: not trained) and the batch's group statistics."""

    values: list[float | None]
    metrics: dict[str, float] = field(default_factory=dict)


def compute_advantages(
    trajectories: Sequence[Trajectory],
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    zero_variance: str = "skip",
    group_key: Callable[[Trajectory], str] = lambda t: t.instance_id,
) -> Advantages:
    """Group the trajectories by task and compute their advantages."""
    if zero_variance not in ("skip", "keep"):
        raise ValueError(f"zero_variance must be 'skip' or 'keep', got {zero_variance!r}")
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        key = group_key(t)
        if not key:
            raise ValueError(f"trajectory {t.session_id!r} has no group key (instance_id)")
        groups.setdefault(key, []).append(i)

    values: list[float | None] = [None] * len(trajectories)
    live_groups = zero_groups = masked = 0
    rewards: list[float] = []
    for members in groups.values():
        valid = [is_valid(trajectories[i]) for i in members]
        masked += valid.count(False)
        if not any(valid):
            continue
        live_groups += 1
        rewards_G = torch.tensor([float(trajectories[i].outcome.reward) for i in members])  # type: ignore[union-attr]
        valid_G = torch.tensor(valid)
        rewards += rewards_G[valid_G].tolist()
        adv_G, zero = group_advantages(rewards_G, valid_G, scale_by_std=scale_by_std, eps=eps)
        zero_groups += zero
        if zero and zero_variance == "skip":
            continue
        for i, ok, a in zip(members, valid, adv_G.tolist(), strict=True):
            if ok:
                values[i] = a
    metrics = {
        "groups/count": float(live_groups),
        "groups/zero_variance_share": zero_groups / live_groups if live_groups else 0.0,
        "groups/trained_trajectories": float(sum(v is not None for v in values)),
        "groups/masked_trajectories": float(masked),
        "reward/mean": sum(rewards) / len(rewards) if rewards else 0.0,
    }
    return Advantages(values, metrics)
