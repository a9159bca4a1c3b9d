"""Each rollout of a step sorted into what it gave the trainer (legorl/ops/outcomes.py), with
the store's own reason when it has no advantage."""

from __future__ import annotations

from typing import Any

import pytest

from legorl.ops.outcomes import classify


def row(**kw: Any) -> dict[str, Any]:
    return {"status": "failed", "masked": 0, "advantage": None, "reward": 0.0, **kw}


@pytest.mark.parametrize(
    ("t", "var", "untrained", "kind", "why"),
    [
        (row(status=None), None, "not graded yet", "pending", "not graded yet"),
        (row(status="infra_error", masked=1), 0.0, "masked (infrastructure failure): left out", "masked", "masked"),
        (row(status="infra_error", masked=1), 0.0, None, "masked", "masked (infra_error)"),
        (
            row(),
            0.0,
            "group skipped: zero variance (all 4 graded rollouts scored 0), not trained",
            "zero_variance",
            "zero variance",
        ),
        (row(), 0.25, "not trained in its step (older than run.max_staleness: dropped)", "filtered", "max_staleness"),
        (row(advantage=0.87, reward=1.0), 0.25, None, "gradient", "advantage +0.87"),
        (row(advantage=0.0), 0.0, None, "zero_variance", "every graded rollout of its group scored 0"),
        (row(advantage=0.0, reward=0.5), 0.2, None, "zero_advantage", "group's mean"),
    ],
)
def test_each_kind_and_its_reason(t: dict[str, Any], var: float, untrained: str | None, kind: str, why: str) -> None:
    got_kind, got_why = classify(t, var, untrained)
    assert got_kind == kind and why in got_why
