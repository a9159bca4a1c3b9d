"""Trajectories → packed micro-batches of recorded token ids (no padding, no re-tokenising).

Every segment is laid end to end in one row; position ids restart at each segment and
the model's attention is blocked across segments (per-segment attention with `legorl_varlen`
or flash-attention varlen; a block-diagonal mask derived from the position-id resets with
sdpa/eager: see varlen.py and logprobs.py), so no token is spent on padding.
Position n holds token `token_ids[i]` and predicts `token_ids[i+1]`: `targets_N`, `mask_N`
and `rollout_logprobs_N` are therefore the segment's arrays shifted by one, and the last
position of a segment never carries loss.

A trajectory is never split across micro-batches, so every "sequence unit" (trajectory,
segment or turn) is complete inside one forward and its GSPO ratio is exact. A trajectory
longer than the token budget gets a micro-batch of its own.

With `receptive` (a windowed model's reach, receptive_field.py) a segment's tokens further
before its first sampled target than that are dropped: they cannot change any logprob. The
kept tokens keep their recorded positions, so such a segment's positions start above 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from legorl.train.config import SequenceUnit
from legorl.types import Segment, Trajectory

NO_EXPERT = -1  # "routing not recorded for this token": the trainer's router decides


@dataclass
class MicroBatch:
    input_ids_N: torch.Tensor  # (N,) long
    position_ids_N: torch.Tensor  # (N,) long, each token's position in its segment (0 at its start unless trimmed)
    targets_N: torch.Tensor  # (N,) long, the next recorded token (0 at segment ends)
    mask_N: torch.Tensor  # (N,) float, 1 where the target was sampled by the policy
    rollout_logprobs_N: torch.Tensor  # (N,) float32, engine logprob of the target
    advantages_N: torch.Tensor  # (N,) float32
    unit_ids_N: torch.Tensor  # (N,) long in [0, num_units)
    traj_ids_N: torch.Tensor  # (N,) long, index into the step's trajectory list
    versions_N: torch.Tensor  # (N,) long, policy version that sampled the target (-1 unknown)
    replay_N_L_K: torch.Tensor | None  # (N, L, K) long recorded experts of input token n
    segment_lengths: list[int]
    num_units: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids_N.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {}
        for f in fields(self):
            v = getattr(self, f.name)
            moved[f.name] = v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        return MicroBatch(**moved)


def _check_segment(seg: Segment, where: str) -> None:
    n = len(seg.token_ids)
    if n < 2:
        raise ValueError(f"{where}: a segment needs at least 2 tokens, got {n}")
    if len(seg.loss_mask) != n or len(seg.logprobs) != n:
        raise ValueError(
            f"{where}: token_ids, loss_mask and logprobs must have equal lengths, "
            f"got {n}, {len(seg.loss_mask)}, {len(seg.logprobs)}"
        )
    if seg.loss_mask[0]:
        raise ValueError(f"{where}: loss_mask[0] is 1, but the first token has no context to predict it")
    if seg.routed_experts is not None and len(seg.routed_experts) not in (n, n - 1):
        raise ValueError(
            f"{where}: routed_experts has {len(seg.routed_experts)} rows for {n} tokens (expected {n} or {n - 1})"
        )


def _versions(seg: Segment, tmask: torch.Tensor, run_id: torch.Tensor, where: str) -> torch.Tensor:
    """Per-target policy version (-1 unknown); only feeds the staleness metric.

    legorl.trajectory records one version per turn; the turns' completions are the runs of
    sampled tokens. If some turn sampled nothing the runs cannot be matched to turns and the
    oldest version is used (staleness is then over-, never under-stated). A list with one
    entry per token is accepted as well.
    """
    n = len(seg.token_ids)
    pv = seg.policy_versions
    if not pv:
        return torch.full((n,), -1, dtype=torch.long)
    runs = int(run_id.max()) + 1 if bool(tmask.any()) else 0
    if len(pv) == len(seg.turn_indices):
        if len(pv) == runs:
            return torch.tensor(pv, dtype=torch.long)[run_id.clamp(min=0)]
        return torch.full((n,), min(pv), dtype=torch.long)
    if len(pv) == n:
        return torch.tensor(pv[1:] + [pv[-1]], dtype=torch.long)
    raise ValueError(
        f"{where}: policy_versions has {len(pv)} entries; expected one per turn "
        f"({len(seg.turn_indices)}) or one per token ({n})"
    )


def _replay(seg: Segment, where: str) -> torch.Tensor:
    rows = torch.tensor(seg.routed_experts, dtype=torch.long)
    if rows.ndim != 3:
        raise ValueError(f"{where}: routed_experts must be (tokens, layers, top_k), got shape {tuple(rows.shape)}")
    n = len(seg.token_ids)
    if rows.shape[0] == n - 1:  # the last sampled token was never fed through the model
        rows = torch.cat([rows, torch.full_like(rows[:1], NO_EXPERT)])
    return rows


def unseen_head(seg: Segment, receptive: int | None) -> int:
    """How many of the segment's first tokens no sampled target can see: those more than
    `receptive` (+1: a target is predicted at the position before it) before the first one."""
    if receptive is None or 1 not in seg.loss_mask:
        return 0
    return max(0, seg.loss_mask.index(1) - 1 - receptive)


def pack(
    items: Sequence[tuple[int, Trajectory, float]],
    unit: SequenceUnit,
    max_tokens: int,
    receptive: int | None = None,
) -> list[MicroBatch]:
    """Pack (trajectory index, trajectory, advantage) items into micro-batches.

    First-fit decreasing by trajectory length, deterministic. Trajectories without any
    sampled token are dropped (they could only contribute zero loss). `receptive`: drop each
    segment's head that no sampled target can see (module docstring).
    """
    sized = []
    for idx, traj, adv in items:
        for s, seg in enumerate(traj.segments):
            _check_segment(seg, f"trajectory {traj.session_id!r} segment {s}")
        if any(any(seg.loss_mask[1:]) for seg in traj.segments):
            size = sum(len(seg.token_ids) - unseen_head(seg, receptive) for seg in traj.segments)
            sized.append((size, idx, traj, adv))
    sized.sort(key=lambda x: -x[0])
    bins: list[list[tuple[int, Trajectory, float]]] = []
    room: list[int] = []
    for size, idx, traj, adv in sized:
        for b, free in enumerate(room):
            if size <= free:
                bins[b].append((idx, traj, adv))
                room[b] -= size
                break
        else:
            bins.append([(idx, traj, adv)])
            room.append(max_tokens - size)
    return [_build(b, unit, receptive) for b in bins]


def _build(items: list[tuple[int, Trajectory, float]], unit: SequenceUnit, receptive: int | None) -> MicroBatch:
    cols: dict[str, list[torch.Tensor]] = {
        k: [] for k in ("ids", "pos", "tgt", "mask", "lp", "adv", "unit", "traj", "ver", "replay")
    }
    lengths: list[int] = []
    next_unit = 0
    any_replay = any(seg.routed_experts is not None for _, t, _ in items for seg in t.segments)
    replay_shape: tuple[int, int] | None = None
    for idx, traj, adv in items:
        traj_unit = next_unit
        if unit == "trajectory":
            next_unit += 1
        for s, seg in enumerate(traj.segments):
            where = f"trajectory {traj.session_id!r} segment {s}"
            n = len(seg.token_ids)
            ids = torch.tensor(seg.token_ids, dtype=torch.long)
            tmask = torch.tensor(seg.loss_mask[1:] + [0], dtype=torch.float32)
            starts = (tmask > 0) & torch.cat([torch.tensor([True]), tmask[:-1] == 0])
            run_id = torch.cumsum(starts.long(), 0) - 1  # turn index of each target (-1 before the first)
            if unit == "trajectory":
                unit_ids = torch.full((n,), traj_unit, dtype=torch.long)
            elif unit == "segment":
                unit_ids = torch.full((n,), next_unit, dtype=torch.long)
                next_unit += 1
            else:
                runs = int(starts.sum())
                unit_ids = next_unit + run_id.clamp(min=0)
                next_unit += max(runs, 1)
            h = unseen_head(seg, receptive)  # every per-token column is cut at the same place
            cols["ids"].append(ids[h:])
            cols["pos"].append(torch.arange(h, n, dtype=torch.long))
            cols["tgt"].append(torch.cat([ids[1:], ids.new_zeros(1)])[h:])
            cols["mask"].append(tmask[h:])
            cols["lp"].append((torch.tensor(seg.logprobs[1:] + [0.0], dtype=torch.float32) * tmask)[h:])
            cols["adv"].append(torch.full((n - h,), float(adv), dtype=torch.float32))
            cols["unit"].append(unit_ids[h:])
            cols["traj"].append(torch.full((n - h,), idx, dtype=torch.long))
            cols["ver"].append(_versions(seg, tmask, run_id, where)[h:])
            if any_replay:
                if seg.routed_experts is None:
                    raise ValueError(f"{where}: routed_experts missing while other segments have them")
                rows = _replay(seg, where)
                if replay_shape is None:
                    replay_shape = (rows.shape[1], rows.shape[2])
                elif (rows.shape[1], rows.shape[2]) != replay_shape:
                    raise ValueError(
                        f"{where}: routed_experts (layers, top_k) {tuple(rows.shape[1:])} != {replay_shape}"
                    )
                cols["replay"].append(rows[h:])
            lengths.append(n - h)
    return MicroBatch(
        input_ids_N=torch.cat(cols["ids"]),
        position_ids_N=torch.cat(cols["pos"]),
        targets_N=torch.cat(cols["tgt"]),
        mask_N=torch.cat(cols["mask"]),
        rollout_logprobs_N=torch.cat(cols["lp"]),
        advantages_N=torch.cat(cols["adv"]),
        unit_ids_N=torch.cat(cols["unit"]),
        traj_ids_N=torch.cat(cols["traj"]),
        versions_N=torch.cat(cols["ver"]),
        replay_N_L_K=torch.cat(cols["replay"]) if any_replay else None,
        segment_lengths=lengths,
        num_units=next_unit,
    )


def count_units(mb: MicroBatch) -> int:
    """Units with at least one sampled token (the seq-mean denominators)."""
    counts_U = torch.zeros(mb.num_units).index_add(0, mb.unit_ids_N.cpu(), mb.mask_N.cpu())
    return int((counts_U > 0).sum())


def split_balanced(microbatches: Sequence[MicroBatch], parts: int) -> list[list[MicroBatch]]:
    """Deal micro-batches to `parts` data-parallel ranks, longest first onto the lightest."""
    out: list[list[MicroBatch]] = [[] for _ in range(parts)]
    load = [0] * parts
    for mb in sorted(microbatches, key=lambda m: -m.num_tokens):
        r = load.index(min(load))
        out[r].append(mb)
        load[r] += mb.num_tokens
    return out
