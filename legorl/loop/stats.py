"""Resolved rates with honest error bars, and the before/after table.

A rate over n episodes gets a 95% Wilson score interval (right at 0% and 100% too, unlike
the normal approximation). A gain between two checkpoints gets Newcombe's interval for a
difference of two independent proportions (method 10, built from the two Wilson
intervals): the quickstart calls RL's gain real only when that interval excludes zero,
not when one number is larger than another.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion."""
    if n <= 0:
        raise ValueError("wilson interval needs n >= 1")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_diff(s1: int, n1: int, s2: int, n2: int, z: float = Z95) -> tuple[float, float, float]:
    """(p2 - p1, low, high): Newcombe's hybrid score interval for the difference."""
    p1, p2 = s1 / n1, s2 / n2
    l1, u1 = wilson(s1, n1, z)
    l2, u2 = wilson(s2, n2, z)
    d = p2 - p1
    low = d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
    high = d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
    return d, low, high


@dataclass
class Evaluation:
    """One checkpoint evaluated on held-out tasks (masked infrastructure errors left out)."""

    label: str
    resolved: int
    episodes: int  # graded episodes: the denominator
    masked: int = 0  # infrastructure errors, not counted either way
    wall_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.resolved / self.episodes if self.episodes else 0.0

    def as_dict(self) -> dict[str, Any]:
        low, high = wilson(self.resolved, self.episodes) if self.episodes else (0.0, 0.0)
        return {
            "label": self.label,
            "resolved_rate": round(self.rate, 4),
            "resolved": self.resolved,
            "episodes": self.episodes,
            "masked": self.masked,
            "ci95": [round(low, 4), round(high, 4)],
            "wall_s": round(self.wall_s, 1),
            "statuses": dict(self.statuses),
        }


def summarize(label: str, outcomes: Iterable[tuple[bool, bool, str]], wall_s: float) -> Evaluation:
    """From (resolved, masked, status) per episode."""
    items = list(outcomes)
    graded = [(r, st) for r, m, st in items if not m]
    return Evaluation(
        label,
        sum(r for r, _ in graded),
        len(graded),
        len(items) - len(graded),
        wall_s,
        dict(Counter(st for _, _, st in items)),
    )


def gain(before: Evaluation, after: Evaluation) -> dict[str, float]:
    """after − before in points, with Newcombe's 95% interval."""
    d, low, high = newcombe_diff(before.resolved, before.episodes, after.resolved, after.episodes)
    return {"points": round(100 * d, 1), "ci95": [round(100 * low, 1), round(100 * high, 1)]}


def table(rows: Sequence[Evaluation]) -> str:
    """The before/after table as text."""
    lines = [f"{'checkpoint':<16} {'resolved':>9} {'95% CI':>17} {'graded':>7} {'masked':>7} {'wall':>7}"]
    for r in rows:
        low, high = wilson(r.resolved, r.episodes) if r.episodes else (0.0, 0.0)
        lines.append(
            f"{r.label:<16} {r.rate:>8.1%} {f'[{low:.1%}, {high:.1%}]':>17} {r.episodes:>7} "
            f"{r.masked:>7} {r.wall_s:>6.0f}s"
        )
    return "\n".join(lines)
