"""The config rules of asynchronous training (`[run] max_staleness`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from legorl.loop.config import RunConfig


def test_asynchronous_runs_need_a_behaviour_policy_correction_or_the_bypass_ratio() -> None:
    """max_staleness > 0 trains on older policies' tokens: the loss must see their recorded
    logprobs, as importance weights (correction) or as the clip ratio's π_old (bypass)."""
    base = {"harness": {"name": "command", "command_file": "/bin/true"}, "run": {"max_staleness": 1}}
    with pytest.raises(ValidationError, match="old_logprobs = 'rollout'"):
        RunConfig.model_validate(base)
    for trainer in ({"correction": "mis", "correction_level": "geometric"}, {"old_logprobs": "rollout"}):
        assert RunConfig.model_validate({**base, "trainer": trainer}).run.max_staleness == 1
