"""Which rollouts of a step gave gradient, and why the others did not (the UI's Outcomes view).

Why: a step's loss is made by the rollouts whose advantage is non-zero; everything else was
spent without teaching anything, and the reason differs (a zero-variance group, an
infrastructure fault masked out, a stale rollout dropped, a resume that abandoned it). The
reason for a trajectory without an advantage is the store's own (`get_trajectory`'s
`untrained`, written once in legorl/store/queries.py); this only sorts each rollout into one
kind and says the kept-at-zero case the store has no words for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KINDS = ("gradient", "zero_variance", "zero_advantage", "masked", "filtered", "pending")
EPS = 1e-9


def classify(t: Mapping[str, Any], group_var: float | None, untrained: str | None) -> tuple[str, str]:
    """(kind, why) of one trajectory summary (`list_trajectories` item), given its group's
    reward variance (`task_stats`) and the store's reason it has no advantage."""
    if t["status"] is None:
        return "pending", "not graded yet"
    if t["masked"]:
        return (
            "masked",
            untrained or f"masked ({t['status']}): an infrastructure fault, left out of its group and the loss",
        )
    adv = t["advantage"]
    if adv is None:
        if untrained and "zero variance" in untrained:
            return "zero_variance", untrained
        return "filtered", untrained or "not trained"
    if abs(adv) > EPS:
        return "gradient", f"advantage {adv:+.3g}"
    if group_var is not None and group_var <= EPS:
        return "zero_variance", f"kept with advantage 0: every graded rollout of its group scored {t['reward']:g}"
    return "zero_advantage", "advantage 0: its reward is its group's mean"


def step_outcomes(store: Any, step: int) -> dict[str, Any]:
    """Every rollout of `step` with its kind and why, and the counts per kind."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:  # pages of the store's largest size
        page = store.list_trajectories(step=step, limit=1000, order="asc", cursor=cursor, with_total=False)
        items += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    var = {k: v["reward_var"] for k, v in store.task_stats(step).items()}
    rows = []
    for t in items:
        untrained = None
        if t["advantage"] is None:
            view = store.get_trajectory(t["session_id"])
            untrained = view["untrained"] if view else None
        kind, why = classify(t, var.get(t["instance_id"]), untrained)
        rows.append(
            {
                **{k: t[k] for k in ("session_id", "instance_id", "status", "reward", "advantage")},
                "kind": kind,
                "why": why,
            }
        )
    counts = {k: sum(r["kind"] == k for r in rows) for k in KINDS}
    return {"step": step, "counts": counts, "rollouts": rows}
