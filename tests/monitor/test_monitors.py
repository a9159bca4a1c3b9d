"""Runtime monitors on synthetic metric streams: each fires when it should and not otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from legorl.monitor.monitors import (
    MONITOR_NAMES,
    MONITORS,
    MonitorConfig,
    config_docs,
    describe_metrics,
    evaluate,
    run_monitors,
)
from legorl.store.run_store import RunStore

HEALTHY = {
    "reward/mean": 0.3,
    "resolved_rate": 0.3,
    "status/resolved": 0.3,
    "status/failed": 0.7,
    "status/infra_error": 0.0,
    "mismatch/pearson": 0.999,
    "mismatch/mean_abs_dp": 0.003,
    "train/clip_frac": 0.02,
    "train/entropy": 0.8,
    "rollout/action_rate": 0.8,
    "rollout/unparsed_end_rate": 0.1,
    "rollout/parse_failure_rate": 0.01,
    "rollout/tool_call_rate": 0.8,
    "rollout/format_error_rate": 0.01,
    "rollout/response_tokens_mean": 900.0,
    "rollout/turns_mean": 12.0,
    "rollout/tamper_flags": 0.0,
    "groups/zero_variance_share": 0.3,
    "policy/staleness_mean": 0.5,
}


def stream(n: int, last: dict[str, float] | None = None, drift: bool = True) -> list[dict[str, float]]:
    """n healthy steps (reward moving a little), the last one overridden by `last`."""
    out = []
    for s in range(n):
        row = {"step": s, **HEALTHY, "reward/mean": 0.3 + (0.01 * s if drift else 0.0)}
        out.append(row)
    out[-1].update(last or {})
    return out


def names(history: list[dict[str, float]], cfg: MonitorConfig | None = None) -> dict[str, str]:
    """monitor name -> highest severity raised on the last step."""
    order = {"info": 0, "warning": 1, "critical": 2}
    out: dict[str, str] = {}
    for a in evaluate(history, cfg).alerts:
        if a.name not in out or order[a.severity] > order[out[a.name]]:
            out[a.name] = a.severity
    return out


def test_healthy_stream_raises_nothing() -> None:
    assert names(stream(30)) == {}
    assert evaluate([]).alerts == []


@pytest.mark.parametrize(
    "override, monitor, severity",
    [
        ({"mismatch/pearson": 0.985}, "mismatch", "warning"),
        ({"mismatch/pearson": 0.8}, "mismatch", "critical"),
        ({"mismatch/mean_abs_dp": 0.2}, "mismatch", "warning"),
        ({"status/infra_error": 0.2}, "infra_errors", "warning"),
        ({"status/infra_error": 0.3, "status/sandbox_start_failed": 0.3}, "infra_errors", "critical"),
        ({"rollout/tamper_flags": 1.0}, "tamper", "warning"),
        ({"rollout/tamper_flags": 7.0}, "tamper", "critical"),
        ({"status/hack_detected": 0.05}, "tamper", "warning"),
        ({"rollout/action_rate": 0.5}, "tool_collapse", "warning"),
        ({"rollout/action_rate": 0.1}, "tool_collapse", "critical"),
        ({"rollout/unparsed_end_rate": 0.7}, "tool_collapse", "warning"),
        ({"rollout/parse_failure_rate": 0.1}, "parse_failures", "warning"),
        ({"rollout/parse_failure_rate": 0.4}, "parse_failures", "critical"),
        ({"rollout/response_tokens_mean": 2500.0}, "length_blowup", "warning"),
        ({"rollout/turns_mean": 60.0}, "length_blowup", "critical"),
        ({"groups/zero_variance_share": 0.9}, "zero_variance", "warning"),
        ({"groups/zero_variance_share": 1.0}, "zero_variance", "critical"),
        ({"policy/staleness_mean": 3.0}, "staleness", "warning"),
        ({"policy/staleness_mean": 9.0}, "staleness", "critical"),
    ],
)
def test_each_monitor_fires_alone_at_its_severity(override: dict[str, float], monitor: str, severity: str) -> None:
    assert names(stream(15, override)) == {monitor: severity}


@pytest.mark.parametrize(
    "override",
    [
        {"mismatch/pearson": 0.991},
        {"status/infra_error": 0.1},
        {"rollout/action_rate": 0.65},
        {"rollout/parse_failure_rate": 0.05},
        {"rollout/tool_call_rate": 0.0},  # a harness acting through text blocks calls no tool
        {"rollout/format_error_rate": 0.5},  # nor does the proxy's tool-call markup concern it
        {"rollout/response_tokens_mean": 1700.0},
        {"groups/zero_variance_share": 0.8},
        {"policy/staleness_mean": 2.0},
        {"rollout/unparsed_end_rate": 0.5},
    ],
)
def test_values_at_or_inside_thresholds_stay_quiet(override: dict[str, float]) -> None:
    assert names(stream(15, override)) == {}


def test_drift_monitors_wait_for_a_baseline_and_compare_to_recent_steps() -> None:
    # two previous steps are not a baseline yet (min_baseline_steps=3)
    assert names(stream(3, {"rollout/action_rate": 0.1})) == {}
    assert names(stream(4, {"rollout/action_rate": 0.1})) == {"tool_collapse": "critical"}
    # a slow decline that the recent baseline has followed is not a collapse
    hist = stream(40)
    for s, row in enumerate(hist):
        row["rollout/action_rate"] = 0.8 * (0.99**s)
    assert "tool_collapse" not in names(hist)
    # the current step missing a metric never fires on stale data
    hist = stream(15)
    del hist[-1]["rollout/action_rate"]
    hist[-2]["rollout/action_rate"] = 0.0
    assert names(hist) == {}


def test_reward_flat_needs_n_flat_steps() -> None:
    cfg = MonitorConfig(reward_flat_steps=10)
    assert names(stream(9, drift=False), cfg) == {}
    assert names(stream(10, drift=False), cfg) == {"reward_flat": "warning"}
    flat_then_moving = stream(10, {"reward/mean": 0.5}, drift=False)
    assert names(flat_then_moving, cfg) == {}


def test_should_stop_only_when_configured() -> None:
    bad = stream(15, {"mismatch/pearson": 0.5, "rollout/tamper_flags": 1.0})
    assert not evaluate(bad).should_stop
    assert evaluate(bad, MonitorConfig(stop_on_critical=True)).should_stop
    r = evaluate(bad, MonitorConfig(stop_on=["mismatch"]))
    assert r.should_stop and r.stop_reasons[0].startswith("mismatch:")
    assert not evaluate(bad, MonitorConfig(stop_on=["tamper"])).should_stop  # tamper was only a warning
    assert names(bad, MonitorConfig(disabled=["mismatch"])) == {"tamper": "warning"}


def test_config_rejects_unknown_names_and_fields_and_documents_every_field() -> None:
    with pytest.raises(ValidationError, match="unknown monitor name"):
        MonitorConfig(stop_on=["mismach"])
    with pytest.raises(ValidationError, match="extra"):
        MonitorConfig(mismatch_pearson=0.9)
    assert all(config_docs().values())
    assert tuple(MONITORS) == MONITOR_NAMES
    keys = describe_metrics()
    for key in HEALTHY:
        assert key in keys or key.startswith("status/")


def test_run_monitors_stores_alerts_and_stop_event(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    for row in stream(12, {"mismatch/pearson": 0.5}):
        store.log_metrics(int(row["step"]), {k: v for k, v in row.items() if k != "step"})
    r = run_monitors(store, MonitorConfig(stop_on_critical=True))
    assert r.should_stop
    alerts = store.alerts()
    assert [(a["step"], a["name"], a["severity"]) for a in alerts] == [(11, "mismatch", "critical")]
    assert store.events()[-1]["kind"] == "run_stop_requested"
    assert run_monitors(store, step=5).alerts == []  # evaluating an earlier step sees only its history
