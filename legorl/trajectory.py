"""Turns → trajectory: segments, loss masks and alignment statistics.

A harness keeps its own copy of the conversation and may compact it, reorder it or
re-serialise it. The trainer must nevertheless learn from exactly what was sampled, and
as cheaply as possible: when turn t's prompt extends an earlier turn's prompt+completion
token-for-token (the last turn of a segment), both belong to one **segment** (one forward
pass in the trainer, the shared prefix counted once). When it extends none, a new segment
starts — nothing sampled is dropped, it is just no longer a prefix of what follows. Any
segment may be continued, not only the latest: a harness that runs a sub-agent (Claude
Code's `Agent` tool, OpenCode's subagents) interleaves two conversations in one session,
and each keeps its own segment. `delivered` checks, from the turns' side, that every
sampled token of a policy turn reached the loss.

Side calls (titles, compaction summaries: `proxy.side_call_patterns`) are the policy's
samples too. By default (`side_calls = "separate"`) they are listed apart and never trained;
with `side_calls = "train"` they are chained among themselves by the same rule into segments
of their own, placed after the main conversation's (whose chain and indices they never
touch), so the trainer gives them the rollout's one advantage like any other segment.

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
from typing import Literal, get_args

import numpy as np

from legorl.types import AlignmentStats, Outcome, Routing, Segment, Trajectory, Turn

log = logging.getLogger(__name__)

SideCalls = Literal["separate", "train"]  # what a trajectory does with its side calls (`[harness] side_calls`)
SIDE_CALLS: tuple[str, ...] = get_args(SideCalls)
SIDE_CALLS_DEFAULT: SideCalls = "separate"  # side calls are not policy actions: kept apart unless asked


def extends(prompt: list[int], *parts: list[int]) -> bool:
    """Whether `prompt` begins with `parts` concatenated, token for token: the rule that
    keeps a turn in the segment of what came before it (the proxy's routing trim uses it too)."""
    at = 0
    for part in parts:
        if prompt[at : at + len(part)] != part:
            return False
        at += len(part)
    return True


def _first_mismatch(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _new_segment(turn: Turn) -> Segment:
    return Segment(
        turn_indices=[turn.index],
        token_ids=list(turn.prompt_ids) + list(turn.completion_ids),
        loss_mask=[0] * len(turn.prompt_ids) + [1] * len(turn.completion_ids),
        logprobs=[0.0] * len(turn.prompt_ids) + list(turn.logprobs),
        policy_versions=[turn.policy_version],
    )


def _extend(seg: Segment, turn: Turn) -> None:
    cur = len(seg.token_ids)
    new_prompt = turn.prompt_ids[cur:]
    seg.turn_indices.append(turn.index)
    seg.token_ids += list(new_prompt) + list(turn.completion_ids)
    seg.loss_mask += [0] * len(new_prompt) + [1] * len(turn.completion_ids)
    seg.logprobs += [0.0] * len(new_prompt) + list(turn.logprobs)
    seg.policy_versions.append(turn.policy_version)


class _SegmentRouting:
    """A segment's routing rows, gathered per turn and joined once at the end (joining on
    every turn would copy the whole segment's routing again for each turn)."""

    def __init__(self, turn: Turn) -> None:
        assert turn.routed_experts is not None and turn.routing_base == 0
        self.chunks: list[Routing] = [turn.routed_experts]
        self.rows = len(turn.routed_experts)

    def add(self, turn: Turn) -> bool:
        """Continue with `turn`'s rows past those held; False on a gap (rows missing)."""
        if turn.routed_experts is None or turn.routing_base > self.rows:
            return False
        more = turn.routed_experts[self.rows - turn.routing_base :]
        if len(more):
            if self.rows and self.chunks[-1].shape[1:] != more.shape[1:]:
                have = self.chunks[-1].shape[1:]
                raise ValueError(f"turn {turn.index}: routing shape {more.shape[1:]} != the segment's {have}")
            self.chunks.append(more)
            self.rows += len(more)
        return True

    def join(self) -> Routing:
        parts = [c for c in self.chunks if len(c)] or self.chunks[:1]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _start_routing(turn: Turn) -> _SegmentRouting | None:
    if turn.routed_experts is None:
        return None
    if turn.routing_base:
        log.warning("turn %d of session %s starts a segment without its prompt's routing", turn.index, turn.session_id)
        return None
    return _SegmentRouting(turn)


def _segment_for(turn: Turn, segments: list[Segment], prev_seg: int | None) -> int | None:
    """The segment `turn` continues: the one whose tokens its prompt begins with. Several
    conversations can be open at once in one session (a sub-agent's turns interleaved with
    its parent's, parallel threads), so every segment is a candidate, not only the last.
    The segment of the turn just before wins (the proxy trimmed this turn's routing
    against that one); otherwise the longest match."""
    if prev_seg is not None and extends(turn.prompt_ids, segments[prev_seg].token_ids):
        return prev_seg
    best: int | None = None
    for k, seg in enumerate(segments):
        if (best is None or len(seg.token_ids) > len(segments[best].token_ids)) and extends(
            turn.prompt_ids, seg.token_ids
        ):
            best = k
    return best


def _chain(turns: list[Turn], sid: str, stats: AlignmentStats) -> list[Segment]:
    """Segments of `turns` (in call order): each continues a segment it extends or starts
    one. `stats` gets the reused prompt tokens and the first divergence."""
    segments: list[Segment] = []
    routing: list[_SegmentRouting | None] = []  # per segment
    prev_seg: int | None = None  # the segment of the previous turn
    for turn in turns:
        if len(turn.logprobs) != len(turn.completion_ids):
            raise ValueError(
                f"turn {turn.index} of session {sid}: {len(turn.logprobs)} logprobs for "
                f"{len(turn.completion_ids)} completion ids"
            )
        k = _segment_for(turn, segments, prev_seg)
        if k is not None:
            stats.reused_prompt_tokens += len(segments[k].token_ids)
            _extend(segments[k], turn)
            if routing[k] is not None and not routing[k].add(turn):
                routing[k] = None
            prev_seg = k
            continue
        if segments and stats.first_divergence is None:
            cur = segments[-1].token_ids
            stats.first_divergence = {"turn": turn.index, "token": _first_mismatch(turn.prompt_ids, cur)}
        segments.append(_new_segment(turn))
        routing.append(_start_routing(turn))
        prev_seg = len(segments) - 1
    for seg, rows in zip(segments, routing, strict=True):
        seg.routed_experts = rows.join() if rows is not None else None
    return segments


def assemble(
    turns: list[Turn],
    session_id: str | None = None,
    *,
    instance_id: str = "",
    harness: str = "",
    step: int = 0,
    outcome: Outcome | None = None,
    side_calls: SideCalls = SIDE_CALLS_DEFAULT,
) -> Trajectory:
    """Build one trajectory from a session's turns (in call order).

    Each policy turn either continues a segment (its prompt begins with that segment's
    tokens) or starts one; side calls are listed apart (`side_turns`). A sub-agent's
    conversation thus becomes its own segment(s) beside its parent's, and every sampled
    token is in exactly one segment with mask 1 — all of them trained with the rollout's
    outcome. `side_calls = "train"`: the side calls with sampled tokens become segments too,
    chained among themselves, after the policy turns' (still listed in `side_turns`). The
    identity fields and the outcome are the caller's (the trajectory is frozen: they are
    given here, never stamped on after)."""
    if side_calls not in SIDE_CALLS:
        raise ValueError(f"side_calls must be one of {', '.join(SIDE_CALLS)}, got {side_calls!r}")
    turns = sorted(turns, key=lambda t: t.index)
    sid = session_id if session_id is not None else (turns[0].session_id if turns else "")
    stats = AlignmentStats(side_calls=side_calls)
    side = [t for t in turns if t.side_call]
    segments = _chain([t for t in turns if not t.side_call], sid, stats)
    if side_calls == "train":  # a side call's chain never joins or divides the main conversation's
        side_segments = _chain([t for t in side if t.completion_ids], sid, AlignmentStats())
        segments += side_segments
        stats.side_segments = len(side_segments)
    stats.segments = len(segments)
    stats.tokens = sum(len(s.token_ids) for s in segments)
    stats.sampled_tokens = sum(sum(s.loss_mask) for s in segments)
    return Trajectory(
        session_id=sid,
        segments=segments,
        stats=stats,
        instance_id=instance_id,
        harness=harness,
        step=step,
        outcome=outcome,
        side_turns=[t.index for t in side],
    )


def delivered(turns: list[Turn], traj: Trajectory) -> dict[str, float | int]:
    """How much of what the trajectory trains reaches the loss, checked from the turns' side.

    `policy_tokens`: completion tokens of every turn it trains (every policy turn; the side
    calls too when `traj.stats.side_calls == "train"`); `delivered_tokens`: those found,
    token for token, at mask-1 positions of the segment that lists their turn (so a turn
    dropped, mis-placed or masked out counts as lost); `side_tokens`: side calls' completions
    kept apart on purpose (titles, summaries; 0 when they are trained). `fraction` should be 1.0."""
    by_index = {t.index: t for t in turns}
    placed: dict[int, bool] = {}
    for seg in traj.segments:
        for i in seg.turn_indices:
            t = by_index.get(i)
            if t is None:
                continue
            n, m = len(t.prompt_ids), len(t.completion_ids)
            placed[i] = (
                seg.token_ids[n : n + m] == list(t.completion_ids)
                and all(seg.loss_mask[n : n + m])
                and seg.token_ids[:n] == list(t.prompt_ids)
            )
    trains_side = traj.stats.side_calls == "train"
    policy = [t for t in turns if trains_side or not t.side_call]
    total = sum(len(t.completion_ids) for t in policy)
    got = sum(len(t.completion_ids) for t in policy if placed.get(t.index))
    return {
        "policy_tokens": total,
        "delivered_tokens": got,
        "side_tokens": sum(len(t.completion_ids) for t in turns if t.side_call and not trains_side),
        "fraction": round(got / total, 6) if total else 1.0,
    }
