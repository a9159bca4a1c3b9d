"""The trainer's recomputed logprobs of a step, cut back into segments for the run store.

Why: the trajectory page colours tokens by trainer log-prob and by trainer − rollout, which
only the trainer can say; without this a real run stored none and the page said "no trainer
logprobs yet" on rollouts trained long before. The pre-update forward of every trained
micro-batch already computes each sampled token's logprob (it is π_old, and the mismatch
statistics read it); this module slices that packed row back into segments, aligned with
each segment's `token_ids` (0 at the first token and wherever nothing was sampled), which is
what `RunStore.set_segment_trainer_logprobs` takes.

Cost, bounded by `max_tokens` per step (`[monitor] trainer_logprobs_max_tokens`; 0 keeps
none): one float32 per kept segment token in memory until the step is recorded, and in the
store 4 bytes per segment token plus 4 per completion token (the turn's copy). Segments past
the budget are not kept (first come, first kept) and counted.
"""

from __future__ import annotations

import numpy as np
import torch

from legorl.train.batch import MicroBatch


def split_segments(mb: MicroBatch, logprobs_N: torch.Tensor) -> list[tuple[int, int, np.ndarray]]:
    """(trajectory index, segment index within it, logprobs_T) for every segment of `mb`.

    Position n of the row predicts token n+1 of its segment, so a segment of T tokens at
    offset o gets `logprobs_T[1:] = logprobs_N[o : o+T-1]`; a segment packed without its
    unseen head (batch.py: its first position id h > 0) gets zeros for those h tokens
    first, so the result stays aligned with its `token_ids`. A trajectory is never split
    across micro-batches and its segments are laid in order, so the k-th segment of a
    trajectory met in the row is its segment k."""
    row = logprobs_N.detach().float().cpu().numpy()
    out = []
    seen: dict[int, int] = {}
    start = 0
    for n in mb.segment_lengths:
        traj = int(mb.traj_ids_N[start])
        seg = seen.get(traj, 0)
        seen[traj] = seg + 1
        h = int(mb.position_ids_N[start])  # tokens trimmed from the segment's head
        lp_T = np.zeros(h + n, dtype=np.float32)
        lp_T[h + 1 :] = row[start : start + n - 1]
        out.append((traj, seg, lp_T))
        start += n
    return out


class KeptLogprobs:
    """Up to `max_tokens` segment tokens' trainer logprobs of one step, keyed by
    (trajectory index in the step's list, segment index)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        self.dropped = 0  # segments past the budget
        self.segments: dict[tuple[int, int], np.ndarray] = {}

    def add(self, mb: MicroBatch, logprobs_N: torch.Tensor) -> None:
        for traj, seg, lp_T in split_segments(mb, logprobs_N):
            if self.tokens + len(lp_T) > self.max_tokens:
                self.dropped += 1
                continue
            self.tokens += len(lp_T)
            self.segments[(traj, seg)] = lp_T
