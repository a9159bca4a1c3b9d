"""Turns → trajectory: segments, loss masks and alignment statistics.

A harness keeps its own copy of the conversation and may compact it, reorder it or
re-serialise it. The trainer must nevertheless learn from exactly what was sampled, and
as cheaply as possible: when turn t's prompt extends turn t-1's prompt+completion
token-for-token, both belong to one **segment** (one forward pass in the trainer, the
shared prefix counted once). When it does not, a new segment starts — nothing sampled is
dropped, it is just no longer a prefix of what follows.

Loss masks are 1 exactly on completion tokens (what the policy sampled); prompt tokens,
harness-inserted text and tool outputs are 0, even when they lie between two completions.

MoE routing: position p of a segment takes its routed experts from the turn that first
covered p (the pass that produced the sampled tokens after it). An engine may omit the
last sampled token's routing (it was never fed back); the next turn's prefill supplies it
when the segment continues. A turn's routing may start at `routing_base` > 0 (the proxy
dropped rows the previous turn already had); if a segment would then lack rows, its
routing is dropped (None: the trainer's router decides) rather than misaligned.
"""

from __future__ import annotations

import logging

import numpy as np

from legorl.types import AlignmentStats, Routing, Segment, Trajectory, Turn

log = logging.getLogger(__name__)


def _first_mismatch(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _new_segment(turn: Turn) -> Segment:
    routing = turn.routed_experts if turn.routed_experts is not None and turn.routing_base == 0 else None
    if turn.routed_experts is not None and routing is None:
        log.warning("turn %d of session %s starts a segment without its prompt's routing", turn.index, turn.session_id)
    return Segment(
        turn_indices=[turn.index],
        token_ids=list(turn.prompt_ids) + list(turn.completion_ids),
        loss_mask=[0] * len(turn.prompt_ids) + [1] * len(turn.completion_ids),
        logprobs=[0.0] * len(turn.prompt_ids) + list(turn.logprobs),
        policy_versions=[turn.policy_version],
        routed_experts=routing,
    )


def _more_routing(have: Routing, turn: Turn) -> Routing | None:
    """`have` (rows 0..len-1 of the segment) continued by `turn`'s rows; None on a gap."""
    assert turn.routed_experts is not None
    start = len(have) - turn.routing_base
    if start < 0:
        return None
    rows = turn.routed_experts[start:]
    if not len(rows):
        return have
    if len(have) and have.shape[1:] != rows.shape[1:]:
        raise ValueError(f"turn {turn.index}: routing shape {rows.shape[1:]} != the segment's {have.shape[1:]}")
    return np.concatenate([have, rows]) if len(have) else rows


def _extend(seg: Segment, turn: Turn) -> None:
    cur = len(seg.token_ids)
    new_prompt = turn.prompt_ids[cur:]
    seg.turn_indices.append(turn.index)
    seg.token_ids += list(new_prompt) + list(turn.completion_ids)
    seg.loss_mask += [0] * len(new_prompt) + [1] * len(turn.completion_ids)
    seg.logprobs += [0.0] * len(new_prompt) + list(turn.logprobs)
    seg.policy_versions.append(turn.policy_version)
    if seg.routed_experts is not None and turn.routed_experts is not None:
        seg.routed_experts = _more_routing(seg.routed_experts, turn)
    else:
        seg.routed_experts = None


def assemble(turns: list[Turn], session_id: str | None = None) -> Trajectory:
    """Build one trajectory from a session's turns (in call order)."""
    turns = sorted(turns, key=lambda t: t.index)
    sid = session_id if session_id is not None else (turns[0].session_id if turns else "")
    stats = AlignmentStats()
    segments: list[Segment] = []
    side: list[int] = []
    for turn in turns:
        if turn.side_call:
            side.append(turn.index)
            continue
        if len(turn.logprobs) != len(turn.completion_ids):
            raise ValueError(
                f"turn {turn.index} of session {sid}: {len(turn.logprobs)} logprobs for "
                f"{len(turn.completion_ids)} completion ids"
            )
        if segments:
            cur = segments[-1].token_ids
            if len(turn.prompt_ids) >= len(cur) and turn.prompt_ids[: len(cur)] == cur:
                stats.reused_prompt_tokens += len(cur)
                _extend(segments[-1], turn)
                continue
            if stats.first_divergence is None:
                stats.first_divergence = {"turn": turn.index, "token": _first_mismatch(turn.prompt_ids, cur)}
        segments.append(_new_segment(turn))
    stats.segments = len(segments)
    stats.tokens = sum(len(s.token_ids) for s in segments)
    stats.sampled_tokens = sum(sum(s.loss_mask) for s in segments)
    return Trajectory(session_id=sid, segments=segments, stats=stats, side_turns=side)
