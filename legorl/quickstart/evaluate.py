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
    """One checkpoint evaluated on held-out tasks."""

    label: str
    resolved: int
    episodes: int
    wall_s: float = 0.0
    path: str = "in-process"  # or "harness"
    statuses: dict[str, int] = field(default_factory=dict)
    choices: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the harness rows' replay parity

    @property
    def rate(self) -> float:
        return self.resolved / self.episodes if self.episodes else 0.0

    def as_dict(self) -> dict[str, Any]:
        low, high = wilson(self.resolved, self.episodes) if self.episodes else (0.0, 0.0)
        return {
            "label": self.label, "resolved_rate": round(self.rate, 4), "resolved": self.resolved,
            "episodes": self.episodes, "ci95": [round(low, 4), round(high, 4)], "wall_s": round(self.wall_s, 1),
            "path": self.path, "statuses": dict(self.statuses), "choices": dict(self.choices), **self.extra,
        }  # fmt: skip


def summarize(label: str, outcomes: Iterable[tuple[bool, str, str]], wall_s: float, path: str) -> Evaluation:
    """From (resolved, status, choice) per episode; `choice` names which function the
    agent's fix rewrote relative to the task ("failing", "first", "other", "none")."""
    items = list(outcomes)
    return Evaluation(
        label, sum(r for r, _, _ in items), len(items), wall_s, path,
        dict(Counter(s for _, s, _ in items)), dict(Counter(c for _, _, c in items)),
    )  # fmt: skip


def table(rows: Sequence[Evaluation]) -> str:
    """The before/after table as text."""
    lines = [f"{'checkpoint':<14} {'resolved':>9} {'95% CI':>17} {'episodes':>9} {'path':>11} {'wall':>7}"]
    for r in rows:
        low, high = wilson(r.resolved, r.episodes)
        lines.append(
            f"{r.label:<14} {r.rate:>8.1%} {f'[{low:.1%}, {high:.1%}]':>17} {r.episodes:>9} {r.path:>11} {r.wall_s:>6.0f}s"
        )
    return "\n".join(lines)
