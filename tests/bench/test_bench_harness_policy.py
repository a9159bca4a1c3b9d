"""bench/harness_policy.py's run: the base config with only the policy, the token budget, the
step count and the control changed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bench.harness_policy import config
from tests.helpers.paths import ROOT


@pytest.mark.parametrize("base", ["quickstart.toml", "quickstart-claude-code.toml"])
def test_a_variant_run_changes_only_what_it_says(base: str, tmp_path: Path) -> None:
    path = ROOT / "examples" / base
    before, after = tomllib.loads(path.read_text()), tomllib.loads(config(tmp_path / "m", tmp_path / "run", path))
    assert after["run"]["dir"] == str(tmp_path / "run") and after["run"]["steps"] == 16
    assert (
        after["engine"]["model"]
        == after["trainer"]["model"]
        == after["warm_start"]["engine"]["model"]
        == str(tmp_path / "m")
    )
    assert after["proxy"]["max_tokens"] == 96 and after["warm_start"]["control_steps"] == 0
    assert after["warm_start"]["steps"] == before["warm_start"]["steps"]  # SFT is not GSPO's step count
    assert after["harness"] == before["harness"] and after["calc_tasks"] == before["calc_tasks"]


def test_without_start_the_random_init_is_not_evaluated(tmp_path: Path) -> None:
    path = ROOT / "examples" / "quickstart-claude-code.toml"
    after = tomllib.loads(config(tmp_path / "m", tmp_path / "run", path, start=False))
    assert after["heldout"]["at"] == ["warm_start", "end"]
