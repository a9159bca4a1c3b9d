"""The paper-table configs, shrunk: one GSPO step inside Claude Code, OpenCode, OpenHands SDK,
Codex, and the mixed-harness config, each through `legorl train`'s one loop.

Each run is its example config (examples/quickstart-<harness>.toml) cut to two demonstrations
(p_read = 1: the demonstrator acting through the harness's own shell tool must resolve both),
one SFT step, and one GSPO step of two rollouts. Checked per run: the demonstrations were tool
calls the harness ran (resolved), the GSPO loss is finite, every rollout is the agent's outcome
(never infra), each first prompt is the template's canonical rendering (decode → encode gives
its ids back), and each trajectory's turns assemble into one segment whose sampled tokens are
all trained: every later prompt re-rendered the history the harness sent back to exactly the
ids the policy sampled. The mixed run records
each group's harness on its trajectories, both members alike.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness_util import harness_missing
from tests.helpers.paths import ROOT

EXAMPLES = ROOT / "examples"
HARNESSES = ["claude-code", "opencode", "openhands", "codex"]
MASKED = ("infra_error", "engine_error", "sandbox_start_failed")


def shrunk(name: str, run_dir: Path) -> Any:
    from legorl.loop.config import RunConfig, load_run_config

    d = load_run_config(EXAMPLES / f"quickstart-{name}.toml").model_dump()
    d["run"].update(dir=run_dir, steps=1, tasks_per_step=2 if name == "mixed" else 1, group_size=2)
    d["run"].update(max_concurrent_rollouts=4, time_budget_s=None)
    d["calc_tasks"].update(train=4, heldout=1)
    d["heldout"]["tasks"] = 0
    d["warm_start"].update(episodes=2, steps=1, batch_size=2, control_steps=0)
    d["warm_start"]["engine"]["options"] = {"p_read": 1.0}
    d["trainer"]["zero_variance_groups"] = "keep"  # an untrained step's failed rollouts still make a loss
    return RunConfig.model_validate(d)


def _missing(name: str) -> str | None:
    from legorl.loop.config import load_run_config

    cfg = load_run_config(EXAMPLES / f"quickstart-{name}.toml")
    for h in cfg.harness.names():
        if why := harness_missing(h):
            return why
    return None


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.parametrize("name", [*HARNESSES, "mixed"])
def test_one_gspo_step_inside_the_harness(name: str, tmp_path: Path) -> None:
    if why := _missing(name):
        pytest.skip(why)
    from legorl.loop.train import train
    from legorl.models import load_tokenizer
    from legorl.store.phase_steps import WARM_START_STEP
    from legorl.store.run_store import RunStore

    cfg = shrunk(name, tmp_path / "run")
    summary = asyncio.run(train(cfg))
    assert len(summary["steps"]) == 1
    tok = load_tokenizer(cfg.engine.model)
    with RunStore(tmp_path / "run", readonly=True) as store:
        (step0,) = [h for h in store.metrics_history() if h["step"] == 0]
        assert math.isfinite(step0["train/loss"])
        items = store.list_trajectories(limit=50)["items"]
        demos = [i for i in items if i["step"] == WARM_START_STEP]
        assert len(demos) == 2 and all(i["status"] == "resolved" for i in demos), [
            (i["harness"], i["status"], i["n_turns"], (store.get_trajectory(i["session_id"]) or {}).get("outcome"))
            for i in demos
        ]
        rollouts = [i for i in items if i["step"] == 0]
        assert len(rollouts) == 2 * cfg.run.tasks_per_step
        for item in items:
            assert item["status"] not in MASKED, item
            assert item["harness"] in cfg.harness.names(), item
            turns = store.load_turns(item["session_id"])
            assert turns, item
            main = [t for t in turns if not t.side_call]
            first = main[0].prompt_ids  # rendered by the template alone (later prompts splice sampled ids in)
            assert tok.encode(tok.decode(first), add_special_tokens=False) == first
            traj = store.load_trajectory(item["session_id"])
            assert traj is not None and len(traj.segments) == 1, (item, traj and traj.stats)
            assert sum(sum(s.loss_mask) for s in traj.segments) == sum(len(t.completion_ids) for t in main)
        if name == "mixed":
            by_task: dict[str, set[str]] = {}
            for i in rollouts:
                by_task.setdefault(i["instance_id"], set()).add(i["harness"])
            assert all(len(h) == 1 for h in by_task.values()), by_task  # a group is one harness


def test_a_mix_naming_an_unknown_harness_or_weighing_nothing_fails_at_load(tmp_path: Path) -> None:
    from legorl.config import ConfigError
    from legorl.loop.config import load_run_config

    for mix, said in (('{ claude-code = 1, "cloud-code" = 1 }', "cloud-code"), ("{ opencode = 0, codex = 0 }", "sum")):
        p = tmp_path / "run.toml"
        p.write_text(f"[harness]\nname = 'claude-code'\nmix = {mix}\n")
        with pytest.raises(ConfigError) as e:
            load_run_config(p)
        assert said in str(e.value) and "harness.mix" in str(e.value)


def test_the_draw_is_per_group_seeded_and_weighted() -> None:
    from legorl.loop.config import HarnessSection

    h = HarnessSection(name="claude-code", mix={"claude-code": 3, "opencode": 1, "codex": 0})
    assert h.names() == ["claude-code", "opencode"]  # a zero weight is never drawn
    draws = [h.draw(0, step, f"task-{k}") for step in range(50) for k in range(8)]
    assert draws == [h.draw(0, step, f"task-{k}") for step in range(50) for k in range(8)]  # a resume draws alike
    share = draws.count("claude-code") / len(draws)
    assert 0.68 < share < 0.82, share


@pytest.mark.harness
def test_a_window_too_small_for_the_harness_prompt_is_refused_before_anything_runs(tmp_path: Path) -> None:
    if why := harness_missing("claude-code"):
        pytest.skip(why)
    from legorl.loop.errors import RunError
    from legorl.loop.train import train

    cfg = shrunk("claude-code", tmp_path / "run")
    small = cfg.model_copy(update={"proxy": cfg.proxy.model_copy(update={"max_context": 4096})})
    with pytest.raises(RunError) as e:
        asyncio.run(train(small))
    msg = str(e.value)
    assert "'claude-code'" in msg and "4096-token window" in msg and "-token prompt" in msg
    assert not list((tmp_path / "run").glob("step_*"))  # nothing trained, nothing evaluated


def test_a_mixed_run_reports_a_gain_per_harness(tmp_path: Path) -> None:
    """Held-out rows `label@harness` give each harness its own gains; a one-harness run's
    names are unchanged."""
    from legorl.loop.report import Report
    from legorl.loop.stats import Evaluation

    mixed = Report(tmp_path)
    for h, (w, e) in {"claude-code": (40, 90), "opencode": (50, 55)}.items():
        mixed.add(Evaluation(f"warm_start@{h}", w, 200), step=1)
        mixed.add(Evaluation(f"end@{h}", e, 200), step=2)
    gains = mixed.gains()
    assert set(gains) == {"gspo_over_warm_start@claude-code", "gspo_over_warm_start@opencode"}
    assert round(gains["gspo_over_warm_start@claude-code"]["points"], 1) == 25.0
    assert round(gains["gspo_over_warm_start@opencode"]["points"], 1) == 2.5
    one = Report(tmp_path / "one")
    (tmp_path / "one").mkdir()
    one.add(Evaluation("warm_start", 40, 200), step=1)
    one.add(Evaluation("end", 90, 200), step=2)
    assert set(one.gains()) == {"gspo_over_warm_start"}
