"""A small quickstart end to end, in process (no harness): every phase runs, the results
file and the run store hold what the UI and the bench read. Learning itself (the ≥15-point
GSPO gain on 300 held-out episodes) is measured by bench/quickstart.py, not asserted here:
a two-step GSPO run cannot show it, and timed/learning claims do not belong in tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from legorl.config import ConfigError
from legorl.quickstart.config import QuickstartConfig, load_quickstart
from legorl.quickstart.run import run_with_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart.toml"


def test_example_config_loads_and_bad_fields_are_named(tmp_path: Path) -> None:
    cfg = load_quickstart(EXAMPLE)
    assert cfg.heldout_episodes >= 300 and cfg.harness == "mini-swe-agent"
    assert cfg.run_dir.is_absolute() and cfg.run_dir.is_relative_to(EXAMPLE.parent)
    bad = tmp_path / "bad.toml"
    bad.write_text("[quickstart]\nrl_stpes = 3\np_read = 2.0\n")
    with pytest.raises(ConfigError) as e:
        load_quickstart(bad)
    assert "rl_stpes: unknown field" in str(e.value) and "p_read" in str(e.value)
    (tmp_path / "none.toml").write_text("[run]\nsteps = 1\n")
    with pytest.raises(ConfigError, match="no \\[quickstart\\] table"):
        load_quickstart(tmp_path / "none.toml")


@pytest.mark.slow
def test_small_run_in_process(tmp_path: Path) -> None:
    cfg = QuickstartConfig(
        harness="none", expert_episodes=96, heldout_episodes=32, sft_steps=100, rl_steps=2,
        rl_tasks_per_step=4, rl_group_size=4, control_sft_steps=4,
    )  # fmt: skip
    res = run_with_config(cfg, tmp_path)
    assert json.loads((tmp_path / "quickstart_results.json").read_text())["table"] == res["table"]
    rows = res["table"]
    assert set(rows) == {"start", "after_sft", "after_gspo", "control_more_sft"}
    assert res["control_more_sft"]["extra_sft_steps"] == 4 and "points" in res["control_more_sft"]["gain_over_sft"]
    for row in rows.values():
        ev = row["in-process"]
        assert ev["episodes"] == 32 and 0.0 <= ev["ci95"][0] <= ev["resolved_rate"] <= ev["ci95"][1] <= 1.0
    submitted = lambda ev: ev["statuses"].get("resolved", 0) + ev["statuses"].get("failed", 0)
    assert submitted(rows["start"]["in-process"]) == 0  # random weights never write a valid action
    assert submitted(rows["after_sft"]["in-process"]) >= 16  # SFT taught the commands
    assert set(res["phases_s"]) >= {"expert_data", "sft", "gspo", "eval_start", "eval_after_sft", "eval_after_gspo"}
    assert "points" in res["gspo_gain_over_sft"] and res["run_dir"] == str(tmp_path)

    from legorl.monitor.store import RunStore

    with RunStore(tmp_path, readonly=True) as store:
        keys = set(store.metric_keys())
        assert {"sft/loss", "reward/resolved_rate", "eval/after_sft/resolved_rate"} <= keys
        page = store.list_trajectories(limit=1000)
        assert page["total"] >= 96 + 32  # every demonstration, a sample of each evaluation
        sid = page["items"][0]["session_id"]
        assert store.load_turns(sid) and store.load_trajectory(sid).outcome is not None
    assert not (tmp_path / "work").exists()  # episode directories are cleaned up
