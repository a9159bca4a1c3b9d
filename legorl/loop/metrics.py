"""Per-step rollout metrics, with the keys the monitors read (monitor/monitors.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from legorl.types import Status

TAMPER_FLAGS = ("tamper_attempt", "hack_detected")


def rollout_metrics(records: Sequence[Any], trainer_version: int) -> dict[str, float]:
    """Rates over a step's rollouts (`records` are loop.worker.RolloutRecord)."""
    n = len(records)
    if n == 0:
        return {}
    out: dict[str, float] = {}
    statuses = Counter(r.trajectory.outcome.status for r in records)
    for s in Status:
        out[f"status/{s.value}"] = statuses.get(s, 0) / n
    valid = [r for r in records if not r.trajectory.outcome.masked]
    out["reward/mean"] = sum(r.trajectory.outcome.reward for r in valid) / len(valid) if valid else 0.0
    out["resolved_rate"] = statuses.get(Status.RESOLVED, 0) / n
    policy_turns = [t for r in records for t in r.turns if not t.side_call]
    if policy_turns:
        out["rollout/tool_call_rate"] = sum(1 for t in policy_turns if t.tool_calls) / len(policy_turns)
        out["rollout/format_error_rate"] = sum(1 for t in policy_turns if t.format_error) / len(policy_turns)
        stale = [trainer_version - t.policy_version for t in policy_turns]
        out["policy/staleness_mean"] = sum(stale) / len(stale)
    lasts = [max((t for t in r.turns if not t.side_call), key=lambda t: t.index, default=None) for r in records]
    ended = [t for t in lasts if t is not None]
    if ended:
        out["rollout/prose_end_rate"] = sum(1 for t in ended if not t.tool_calls) / len(ended)
    out["rollout/response_tokens_mean"] = sum(r.trajectory.stats.sampled_tokens for r in records) / n
    out["rollout/turns_mean"] = sum(sum(1 for t in r.turns if not t.side_call) for r in records) / n
    out["rollout/segments_mean"] = sum(r.trajectory.stats.segments for r in records) / n
    out["rollout/side_calls_mean"] = sum(len(r.trajectory.side_turns) for r in records) / n
    out["rollout/tamper_flags"] = float(
        sum(1 for r in records if any(f in TAMPER_FLAGS for f in r.trajectory.outcome.flags))
    )
    return out
