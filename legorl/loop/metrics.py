"""Per-step rollout metrics, with the keys the monitors read (monitor/monitors.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from legorl import ledger
from legorl.harness.actions import TOOL_CALLS, ActionFormat
from legorl.train.advantages import is_valid
from legorl.trajectory import delivered
from legorl.types import Status, Trajectory

TAMPER_FLAGS = ("tamper_attempt", "hack_detected")


def rollout_metrics(
    records: Sequence[Any],
    trainer_version: int,
    formats: Mapping[str, ActionFormat] | None = None,
    advantages: Mapping[str, float | None] | None = None,
) -> dict[str, float]:
    """Rates over a step's rollouts (`records` are loop.worker.RolloutRecord). `formats`: each
    harness's action format (the run store's `action_formats()`); a harness missing there is
    judged by the dialect's tool calls. `advantages`: each trajectory the trainer was given
    (by session id) with its advantage; with it, the step's token ledger per harness."""
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
    out.update(action_metrics(records, formats or {}))
    out.update(harness_metrics(records))
    out["rollout/response_tokens_mean"] = sum(r.trajectory.stats.sampled_tokens for r in records) / n
    out["rollout/turns_mean"] = sum(sum(1 for t in r.turns if not t.side_call) for r in records) / n
    out["rollout/segments_mean"] = sum(r.trajectory.stats.segments for r in records) / n
    out["rollout/side_calls_mean"] = sum(len(r.trajectory.side_turns) for r in records) / n
    # the worst trajectory's share of its policy tokens that reach the loss (1.0: none lost)
    fractions = [float(delivered(r.turns, r.trajectory)["fraction"]) for r in valid]
    if fractions:
        out["rollout/delivered_fraction_min"] = min(fractions)
    out["rollout/tamper_flags"] = float(
        sum(1 for r in records if any(f in TAMPER_FLAGS for f in r.trajectory.outcome.flags))
    )
    if advantages is not None:
        out.update(ledger.to_metrics(step_ledgers(records, advantages)))
    return out


def fate(traj: Trajectory, advantages: Mapping[str, float | None]) -> ledger.Fate | None:
    """Why the trainer left a whole trajectory out (None: it trained it): not given to it
    (dropped as stale), no advantage for an infrastructure fault, or a skipped group."""
    if traj.session_id not in advantages:
        return "stale"
    if advantages[traj.session_id] is not None:
        return None
    return "zero_variance" if is_valid(traj) else "infra_mask"


def step_ledgers(records: Sequence[Any], advantages: Mapping[str, float | None]) -> dict[str, ledger.TokenLedger]:
    """The step's token ledger per harness (legorl/ledger.py)."""
    out: dict[str, ledger.TokenLedger] = {}
    for r in records:
        led = ledger.rollout_ledger(
            r.turns,
            r.trajectory,
            aborted_tokens=r.aborted_tokens,
            retried_tokens=r.retried_tokens,
            fate=fate(r.trajectory, advantages),
        )
        out.setdefault(r.trajectory.harness or "unknown", ledger.TokenLedger()).add(led)
    return out


def action_metrics(records: Sequence[Any], formats: Mapping[str, ActionFormat]) -> dict[str, float]:
    """Each policy turn judged by its harness's action format (`legorl.harness.actions`):
    the share that acted, the share that failed to parse (overall and per harness), and the
    share of trajectories whose last turn failed to parse."""
    per: dict[str, list[bool]] = {}
    acted = ended = unparsed_end = 0
    for r in records:
        harness = r.trajectory.harness or ""
        fmt = formats.get(harness, TOOL_CALLS)
        turns = sorted((t for t in r.turns if not t.side_call), key=lambda t: t.index)
        ok = [fmt.parses(t) for t in turns]
        per.setdefault(harness, []).extend(ok)
        acted += sum(1 for t in turns if fmt.acts(t))
        if turns:
            ended += 1
            unparsed_end += not ok[-1]
    n = sum(len(v) for v in per.values())
    if not n:
        return {}
    out = {
        "rollout/action_rate": acted / n,
        "rollout/parse_failure_rate": sum(v.count(False) for v in per.values()) / n,
        "rollout/unparsed_end_rate": unparsed_end / ended,
    }
    for harness, ok in sorted(per.items()):
        if ok and harness:
            out[f"rollout/parse_failure_rate/{harness}"] = ok.count(False) / len(ok)
    return out


def harness_metrics(records: Sequence[Any]) -> dict[str, float]:
    """A mixed-harness step split by harness (`harness/<name>/reward`, `/resolved_rate`,
    `/turns_mean`, `/side_calls_mean`, `/masked`, `/count`): one policy's reward in each
    harness is what a mixed run is about. Empty for a step in one harness (the step's own
    rates say it)."""
    by: dict[str, list[Any]] = {}
    for r in records:
        by.setdefault(r.trajectory.harness or "", []).append(r)
    if len(by) < 2:
        return {}
    out: dict[str, float] = {}
    for harness, recs in sorted(by.items()):
        valid = [r for r in recs if not r.trajectory.outcome.masked]
        key = f"harness/{harness}"
        out[f"{key}/count"] = float(len(recs))
        out[f"{key}/masked"] = float(len(recs) - len(valid))
        out[f"{key}/reward"] = sum(r.trajectory.outcome.reward for r in valid) / len(valid) if valid else 0.0
        out[f"{key}/resolved_rate"] = sum(r.trajectory.outcome.status is Status.RESOLVED for r in recs) / len(recs)
        out[f"{key}/turns_mean"] = sum(sum(1 for t in r.turns if not t.side_call) for r in recs) / len(recs)
        out[f"{key}/side_calls_mean"] = sum(len(r.trajectory.side_turns) for r in recs) / len(recs)
    return out
