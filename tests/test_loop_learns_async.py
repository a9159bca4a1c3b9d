"""The production loop learns asynchronously: `legorl train` on the quickstart slice with
`max_staleness = 1` (tests/learn_util.py has the slice and the checks; the synchronous run
is tests/test_loop_learns.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from learn_util import assert_learns

from legorl.harness.install import HarnessNotInstalled, require

pytestmark = [pytest.mark.harness, pytest.mark.slow]
try:
    require("mini-swe-agent")
except HarnessNotInstalled as e:
    pytest.skip(f"mini-swe-agent not installed: {e}", allow_module_level=True)


@pytest.mark.timeout(1800)
def test_legorl_train_learns_on_held_out_tasks_asynchronously(tmp_path: Path) -> None:
    """16 steps with the next step's rollouts running while the trainer trains."""
    assert_learns(tmp_path, max_staleness=1, steps=16)
