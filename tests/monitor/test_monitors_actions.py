"""Monitors that read turns by each harness's action format: the parse-failure metric (per
harness, per step), the `parse_failures` monitor and its `[monitor]` thresholds, and
`tool_collapse`, which must not call mini-swe-agent's fenced blocks "no tool call"."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from types import SimpleNamespace

from legorl.harness.actions import TOOL_CALLS, text_block
from legorl.loop.config import load_run_config
from legorl.loop.metrics import rollout_metrics
from legorl.loop.startup import record_action_format
from legorl.monitor.monitors import MonitorConfig, RunFacts, evaluate, run_monitors
from legorl.quickstart.expert import FENCE, SUBMIT
from legorl.store.run_store import RunStore
from legorl.types import AlignmentStats, Dialect, FinishReason, Outcome, Segment, Status, Trajectory, Turn
from tests.helpers.paths import ROOT

EXAMPLES = ROOT / "examples"
MINI = "mini-swe-agent-warm"


def turn(index: int, text: str = "", calls: tuple[str, ...] = (), format_error: bool = False) -> Turn:
    return Turn(
        session_id="s",
        index=index,
        dialect=Dialect.OPENAI_CHAT,
        prompt_ids=[1],
        completion_ids=[2, 3],
        logprobs=[-0.1, -0.2],
        finish_reason=FinishReason.STOP,
        sampling_used={},
        response_text=text,
        tool_calls=[{"id": f"c{i}", "name": n, "arguments": "{}"} for i, n in enumerate(calls)],
        format_error=format_error,
    )


def record(harness: str, turns: list[Turn], reward: float = 1.0, step: int = 0) -> SimpleNamespace:
    """What rollout_metrics reads of a `RolloutRecord`."""
    status = Status.RESOLVED if reward else Status.FAILED
    traj = Trajectory(
        "s",
        [],
        AlignmentStats(sampled_tokens=2 * len(turns), segments=1),
        "task",
        harness,
        step,
        Outcome(reward, status),
    )
    return SimpleNamespace(trajectory=traj, turns=turns)


def quickstart_rollout(rng: random.Random, step: int) -> SimpleNamespace:
    """A quickstart episode as mini-swe-agent's text-based agent plays it: one fenced block per
    turn (run the tests, then fix and submit), never a tool call; and, as the policy does after
    its warm start (measured: 4-8% of turns), now and then a turn without a block."""
    first = "Run the tests.\n" + FENCE.format("python3 test_calc.py") if rng.random() > 0.08 else "cat calc.py"
    turns = [
        turn(0, first),
        turn(1, FENCE.format(f"sed -i 's|^def add.*|def add(a, b): return a + b|' calc.py && {SUBMIT}")),
    ]
    return record(MINI, turns, float(rng.random() < 0.5), step)


def test_the_quickstart_raises_no_tool_collapse_over_its_24_steps(tmp_path: Path) -> None:
    """Every one of the quickstart's 24 steps used to warn "100% of trajectories end in prose
    without a tool call": mini-swe-agent acts through fenced blocks, so nothing was wrong."""
    cfg = load_run_config(EXAMPLES / "quickstart.toml")
    rng = random.Random(0)
    shares: list[float] = []
    with RunStore(tmp_path / "run") as store:
        record_action_format(store, cfg)
        for step in range(24):
            records = [quickstart_rollout(rng, step) for _ in range(16)]
            m = rollout_metrics(records, 0, store.action_formats())
            assert m["rollout/tool_call_rate"] == 0.0  # what the old monitor read as a collapse
            assert m["rollout/action_rate"] == 1.0 - m["rollout/parse_failure_rate"] > 0.8
            assert m[f"rollout/parse_failure_rate/{MINI}"] == m["rollout/parse_failure_rate"]
            assert m["rollout/unparsed_end_rate"] == 0.0
            store.log_metrics(step, m)
            run_monitors(store, cfg.monitor, step)
            shares.append(m["rollout/parse_failure_rate"])
        assert store.alerts() == []
        assert max(shares) > MonitorConfig().parse_failure_rate_warn  # quiet by the run's own [monitor] section
        # the same policy losing mini's format is caught, in mini's own terms
        bad = [record(MINI, [turn(0, "I think the bug is in add."), turn(1, "Maybe sub.")], 0.0, 24)] * 16
        store.log_metrics(24, rollout_metrics(bad, 0, store.action_formats()))
        alerts = {a.name: a for a in run_monitors(store, cfg.monitor, 24).alerts}
    assert set(alerts) == {"parse_failures", "tool_collapse"}
    assert alerts["parse_failures"].severity == "critical"
    assert (
        alerts["parse_failures"].message == f"100% of {MINI}'s turns did not parse as one ```mswea_bash_command block"
    )
    assert "did not parse as one ```mswea_bash_command block" in alerts["tool_collapse"].message


def test_parse_failure_share_per_harness_and_step() -> None:
    formats = {MINI: text_block(), "claude-code": TOOL_CALLS}
    one = FENCE.format("ls")
    mini = [turn(0, one), turn(1, "no block here"), turn(2, one + one), turn(3, one)]  # 2 of 4 fail
    claude = [
        turn(0, "", ("Bash",)),
        turn(1, '<tool_call>{"name": "Ba', format_error=True),  # the proxy could not parse the call
        turn(2, "", ("Edit",)),
        turn(3, "Done: add() is fixed."),  # Claude Code's final answer: prose, not a failure
    ]
    side = turn(4, "a title for the session")
    side.side_call = True  # not the policy's trajectory: not judged
    m = rollout_metrics([record(MINI, mini), record("claude-code", [*claude, side])], 0, formats)
    assert m[f"rollout/parse_failure_rate/{MINI}"] == 0.5
    assert m["rollout/parse_failure_rate/claude-code"] == 0.25
    assert m["rollout/parse_failure_rate"] == 3 / 8
    assert m["rollout/action_rate"] == 4 / 8  # mini's two single blocks, Claude Code's two calls
    assert m["rollout/unparsed_end_rate"] == 0.0  # both ended on a turn their harness could read
    # a store without formats (written before they were recorded) judges by tool calls
    legacy = rollout_metrics([record(MINI, mini)], 0, None)
    assert legacy["rollout/parse_failure_rate"] == 0.0 and legacy["rollout/action_rate"] == 0.0


def test_parse_failures_monitor_uses_the_monitor_section_thresholds() -> None:
    facts = RunFacts({MINI: text_block(), "claude-code": TOOL_CALLS})
    history = [
        {"step": s, f"rollout/parse_failure_rate/{MINI}": 0.0, "rollout/parse_failure_rate/claude-code": 0.0}
        for s in range(5)
    ]
    history[-1] |= {f"rollout/parse_failure_rate/{MINI}": 0.3, "rollout/parse_failure_rate/claude-code": 0.1}
    alerts = [a for a in evaluate(history, MonitorConfig(), facts).alerts if a.name == "parse_failures"]
    assert [(a.severity, a.message) for a in alerts] == [
        ("warning", "10% of claude-code's turns did not parse as tool calls"),
        ("critical", f"30% of {MINI}'s turns did not parse as one ```mswea_bash_command block"),
    ]
    loose = MonitorConfig(parse_failure_rate_warn=0.2, parse_failure_rate_critical=0.5)
    assert [a.severity for a in evaluate(history, loose, facts).alerts if a.name == "parse_failures"] == ["warning"]
    assert not evaluate(history, MonitorConfig(disabled=["parse_failures"]), facts).alerts


def test_tool_collapse_names_the_action_format_of_the_drop() -> None:
    history = [{"step": s, "rollout/action_rate": 0.9} for s in range(6)]
    history[-1]["rollout/action_rate"] = 0.2
    (alert,) = evaluate(history, MonitorConfig(), RunFacts({MINI: text_block()})).alerts
    assert alert.name == "tool_collapse" and alert.severity == "critical"
    assert alert.message == (
        "the harness acted on 20% of turns (one ```mswea_bash_command block), 78% below its baseline 90%"
    )


def test_the_delivered_fraction_is_the_worst_trajectorys() -> None:
    """A trajectory whose segment holds its turn's sampled tokens at loss positions delivers
    all of them (1.0); one whose segment lost a sampled position to the mask delivers less,
    and the step reports the worst."""
    good, bad = record("claude-code", [turn(0)]), record("claude-code", [turn(0)])
    seg = Segment([0], [1, 2, 3], [0, 1, 1], [0.0, -0.1, -0.2], [0, 0, 0])
    good.trajectory = dataclasses.replace(good.trajectory, segments=[seg])
    bad.trajectory = dataclasses.replace(bad.trajectory, segments=[dataclasses.replace(seg, loss_mask=[0, 1, 0])])
    assert rollout_metrics([good], 0, None)["rollout/delivered_fraction_min"] == 1.0
    assert rollout_metrics([good, bad], 0, None)["rollout/delivered_fraction_min"] == 0.0
