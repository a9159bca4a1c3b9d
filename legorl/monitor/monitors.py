"""Runtime monitors: pure functions over a run's metric history that raise alerts.

Evaluated after every step (`run_monitors(store, cfg)`); each monitor looks at the
latest step (and, for drifts, a baseline of the steps before it) and returns `Alert`s
with a severity: `info`, `warning` or `critical`. Alerts are stored in the run and shown
in the UI; a critical alert stops the run when the config says so (`should_stop`).
They catch the failures that silently ruin RL runs on agents: a trainer that no longer
computes what the engine sampled, infrastructure failing, reward hacking, the policy
dropping tool use or writing actions its harness cannot parse, output blowing up, groups
without learning signal, a stuck reward.

Tool use is judged by each harness's own action format (`legorl.harness.actions`, recorded
in the run store): mini-swe-agent's text-based agent acts through one fenced command block
per turn and never through a tool call, so "no tool call" is no failure there; a turn its
harness cannot parse is, whatever the format (`parse_failures`, `tool_collapse`).

Metric keys (emitted by the rollout loop and the trainer, one value per step):

| key | meaning |
| --- | --- |
| `reward/mean` | mean reward of the step's non-masked trajectories |
| `resolved_rate` | share of trajectories with status `resolved` |
| `status/<status>` | share of trajectories with each `Status` (e.g. `status/infra_error`) |
| `mismatch/pearson` | Pearson correlation of rollout vs trainer token probabilities |
| `mismatch/mean_abs_dp` | mean abs difference of those probabilities |
| `train/clip_frac` | share of tokens (or sequences, GSPO) whose ratio was clipped |
| `train/entropy` | mean token entropy of the policy on sampled tokens |
| `rollout/action_rate` | share of policy turns from which the harness took an action, in its own action format |
| `rollout/parse_failure_rate` | share of policy turns that did not parse as the harness's action format |
| `rollout/parse_failure_rate/<harness>` | the same, for one harness of the run |
| `rollout/unparsed_end_rate` | share of trajectories whose last turn did not parse as the harness's action format |
| `rollout/tool_call_rate` | share of policy turns that contain a tool call of the dialect |
| `rollout/format_error_rate` | share of turns whose tool call markup the proxy could not parse |
| `rollout/response_tokens_mean` | mean completion tokens per trajectory |
| `rollout/turns_mean` | mean policy turns per trajectory |
| `rollout/tamper_flags` | number of trajectories flagged for tampering (test edits, ...) |
| `rollout/delivered_fraction_min` | the worst unmasked trajectory's share of the tokens it trains that reach the loss |
| `ledger/<harness>/sampled` | completion tokens sampled in the step's rollouts of that harness (legorl/ledger.py) |
| `ledger/<harness>/trained` | of them, those that reached the loss |
| `ledger/<harness>/<reason>` | of them, those not trained for `reason`; with `trained` they add up to `sampled` |
| `groups/zero_variance_share` | share of groups whose rewards are all equal (no signal) |
| `policy/staleness_mean` | mean (trainer version - version that sampled) over trained tokens |
| `async/dropped_stale` | trajectories of the step left out as older than `run.max_staleness` |
| `async/trainer_idle_s` | seconds the trainer waited for the step's rollouts (asynchronous runs) |
| `tracker/<sink>/dropped` | writes a tracker (`[monitor] sinks`) dropped since the step before |
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from legorl.harness.actions import TOOL_CALLS, ActionFormat
from legorl.monitor.sinks import SinkName, warn_missing
from legorl.types import INFRA_STATUSES

MONITOR_NAMES = (
    "mismatch",
    "infra_errors",
    "tamper",
    "tool_collapse",
    "parse_failures",
    "length_blowup",
    "zero_variance",
    "reward_flat",
    "staleness",
    "stale_drops",
)
History = Sequence[Mapping[str, float]]  # one dict per step, ascending, each with "step"


class MonitorConfig(BaseModel):
    """Thresholds of the runtime monitors (section `[monitor]` of a run config)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    mismatch_pearson_warn: float = 0.99
    """Warn when rollout/trainer probability correlation (`mismatch/pearson`) is below this."""
    mismatch_pearson_critical: float = 0.9
    """Critical below this correlation: the trainer is optimising something the engine did not sample."""
    mismatch_abs_dp_warn: float = 0.05
    """Warn when the mean |p_rollout - p_trainer| (`mismatch/mean_abs_dp`) exceeds this."""
    infra_error_rate_warn: float = 0.1
    """Warn when the share of infrastructure statuses in a step exceeds this."""
    infra_error_rate_critical: float = 0.5
    """Critical above this share: most of the step's compute is wasted."""
    tamper_flags_critical: int = 5
    """Any tamper flag warns; this many in one step is critical."""
    tool_call_drop_warn: float = 0.3
    """Warn when `rollout/action_rate` (turns the harness acted on) falls this fraction below its baseline."""
    tool_call_drop_critical: float = 0.6
    """Critical when the action rate falls by this fraction (tool-use collapse)."""
    unparsed_end_rate_warn: float = 0.5
    """Warn when more than this share of trajectories end in a turn their harness could not parse."""
    parse_failure_rate_warn: float = 0.05
    """Warn when more than this share of a step's turns (of one harness) did not parse as its action format."""
    parse_failure_rate_critical: float = 0.25
    """Critical above this share of parse failures: the policy is losing the harness's format."""
    growth_warn: float = 2.0
    """Warn when response length or turn count exceeds this multiple of its recent baseline."""
    growth_critical: float = 4.0
    """Critical above this multiple (length blow-up)."""
    zero_variance_share_warn: float = 0.8
    """Warn when more than this share of groups have identical rewards (no learning signal)."""
    zero_variance_share_critical: float = 1.0
    """Critical at or above this share."""
    reward_flat_steps: int = 20
    """Number of consecutive steps the reward must stay flat before `reward_flat` warns."""
    reward_flat_eps: float = 1e-3
    """Max - min of `reward/mean` over those steps below which the reward counts as flat."""
    staleness_warn: float = 2.0
    """Warn when the mean policy staleness (versions behind) exceeds this."""
    staleness_critical: float = 8.0
    """Critical above this staleness."""
    stale_drop_share_warn: float = 0.25
    """Warn when more than this share of a step's rollouts were dropped as too stale (compute wasted)."""
    stale_drop_share_critical: float = 0.75
    """Critical above this share: raise run.max_staleness or speed up the trainer."""
    baseline_steps: int = 10
    """How many previous steps form the baseline of drift monitors."""
    min_baseline_steps: int = 3
    """Drift monitors stay quiet until this many previous steps exist."""
    disabled: list[str] = []
    """Names of monitors not to run."""
    stop_on_critical: bool = False
    """Stop the run on any critical alert."""
    stop_on: list[str] = []
    """Monitors whose critical alerts stop the run even when `stop_on_critical` is false."""
    trainer_logprobs_max_tokens: int = Field(default=1_000_000, ge=0)
    """Per GSPO step, store the trainer's recomputed logprobs of up to this many segment tokens
    (the trajectory page's trainer log-prob colouring; 0: none). Cost: 4 bytes per segment token
    and 4 per completion token in the store (legorl/train/kept_logprobs.py)."""
    sinks: list[SinkName] = []
    """Trackers that get a copy of every step metric, alert, held-out evaluation and the config
    (`tensorboard`, `wandb`, `mlflow`; extra `legorl[trackers]`): see legorl/monitor/sinks.py."""

    @field_validator("disabled", "stop_on")
    @classmethod
    def _known_names(cls, names: list[str]) -> list[str]:
        unknown = sorted(set(names) - set(MONITOR_NAMES))
        if unknown:
            raise ValueError(f"unknown monitor name(s) {unknown}; known: {list(MONITOR_NAMES)}")
        return names

    @field_validator("sinks")
    @classmethod
    def _installed(cls, names: list[str]) -> list[str]:
        names = list(dict.fromkeys(names))
        warn_missing(names)  # one line each, at config load; the run goes on without them
        return names


@dataclass(frozen=True)
class RunFacts:
    """What the monitors know of a run besides its metrics: how each harness acts
    (`RunStore.action_formats()`); a harness not named is taken to act through tool calls."""

    action_formats: Mapping[str, ActionFormat] = field(default_factory=dict)

    def format_label(self, harness: str | None = None) -> str:
        """The action format in words: of one harness, or of all the run's."""
        if harness is not None:
            return self.action_formats.get(harness, TOOL_CALLS).label
        labels = sorted({f.label for f in self.action_formats.values()}) or [TOOL_CALLS.label]
        return " / ".join(labels)


@dataclass
class Alert:
    step: int
    name: str
    severity: str  # info | warning | critical
    message: str
    value: float | None = None
    threshold: float | None = None


@dataclass
class MonitorResult:
    alerts: list[Alert] = field(default_factory=list)
    should_stop: bool = False
    stop_reasons: list[str] = field(default_factory=list)


def _now(history: History, key: str) -> float | None:
    """The latest step's value of `key`, if that step logged it (and it is a number)."""
    if not history:
        return None
    v = history[-1].get(key)
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _baseline(history: History, key: str, cfg: MonitorConfig) -> float | None:
    """Mean of `key` over up to `baseline_steps` steps before the latest one."""
    prev = [float(h[key]) for h in history[:-1] if h.get(key) is not None][-cfg.baseline_steps :]
    return sum(prev) / len(prev) if len(prev) >= cfg.min_baseline_steps else None


def _step(history: History) -> int:
    return int(history[-1].get("step", len(history) - 1))


def _level(value: float, warn: float, critical: float, above: bool = True) -> str | None:
    hit = (lambda t: value > t) if above else (lambda t: value < t)
    return "critical" if hit(critical) else ("warning" if hit(warn) else None)


def mismatch(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    out = []
    r = _now(history, "mismatch/pearson")
    if r is not None and (sev := _level(r, cfg.mismatch_pearson_warn, cfg.mismatch_pearson_critical, above=False)):
        out.append(
            Alert(
                _step(history),
                "mismatch",
                sev,
                f"rollout/trainer prob correlation {r:.4f} < "
                f"{cfg.mismatch_pearson_warn} (check dtype, kernels, routing replay)",
                r,
                cfg.mismatch_pearson_warn,
            )
        )
    dp = _now(history, "mismatch/mean_abs_dp")
    if dp is not None and dp > cfg.mismatch_abs_dp_warn:
        out.append(
            Alert(
                _step(history),
                "mismatch",
                "warning",
                f"mean |p_rollout - p_trainer| {dp:.4f} > {cfg.mismatch_abs_dp_warn}",
                dp,
                cfg.mismatch_abs_dp_warn,
            )
        )
    return out


def infra_errors(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    rates = [_now(history, f"status/{s}") for s in sorted(INFRA_STATUSES)]
    if all(r is None for r in rates):
        return []
    rate = sum(r for r in rates if r is not None)
    sev = _level(rate, cfg.infra_error_rate_warn, cfg.infra_error_rate_critical)
    return (
        [
            Alert(
                _step(history),
                "infra_errors",
                sev,
                f"{rate:.0%} of rollouts hit infrastructure errors "
                "(masked from the loss; see trajectories with status=infra)",
                rate,
                cfg.infra_error_rate_warn,
            )
        ]
        if sev
        else []
    )


def tamper(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    n = _now(history, "rollout/tamper_flags") or 0.0
    hack = _now(history, "status/hack_detected") or 0.0
    if n <= 0 and hack <= 0:
        return []
    sev = "critical" if n >= cfg.tamper_flags_critical else "warning"
    return [
        Alert(
            _step(history),
            "tamper",
            sev,
            f"{int(n)} trajectories flagged for tampering, "
            f"{hack:.0%} graded hack_detected (inspect with filter flags=any)",
            n,
            float(cfg.tamper_flags_critical),
        )
    ]


def tool_collapse(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    out = []
    fmt = run.format_label()
    rate, base = _now(history, "rollout/action_rate"), _baseline(history, "rollout/action_rate", cfg)
    if rate is not None and base is not None and base > 0:
        drop = 1.0 - rate / base
        if sev := _level(drop, cfg.tool_call_drop_warn, cfg.tool_call_drop_critical):
            out.append(
                Alert(
                    _step(history),
                    "tool_collapse",
                    sev,
                    f"the harness acted on {rate:.0%} of turns ({fmt}), {drop:.0%} below its baseline {base:.0%}",
                    rate,
                    base * (1 - cfg.tool_call_drop_warn),
                )
            )
    end = _now(history, "rollout/unparsed_end_rate")
    if end is not None and end > cfg.unparsed_end_rate_warn:
        out.append(
            Alert(
                _step(history),
                "tool_collapse",
                "warning",
                f"{end:.0%} of trajectories end in a turn that did not parse as {fmt} (parse failures)",
                end,
                cfg.unparsed_end_rate_warn,
            )
        )
    return out


def parse_failures(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    """The share of turns whose output did not parse as the harness's action format: per
    harness where the step logged it (the harness is named), else the step's overall share."""
    prefix = "rollout/parse_failure_rate/"
    per = {k[len(prefix) :]: k for k in (history[-1] if history else {}) if k.startswith(prefix)}
    keys: dict[str | None, str] = {**per} or {None: "rollout/parse_failure_rate"}
    out = []
    for harness, key in sorted(keys.items(), key=lambda kv: kv[0] or ""):
        rate = _now(history, key)
        if rate is None or not (sev := _level(rate, cfg.parse_failure_rate_warn, cfg.parse_failure_rate_critical)):
            continue
        whose = f"{harness}'s turns" if harness else "turns"
        out.append(
            Alert(
                _step(history),
                "parse_failures",
                sev,
                f"{rate:.0%} of {whose} did not parse as {run.format_label(harness)}",
                rate,
                cfg.parse_failure_rate_warn,
            )
        )
    return out


def length_blowup(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    out = []
    for key, what in (("rollout/response_tokens_mean", "response length"), ("rollout/turns_mean", "turn count")):
        now, base = _now(history, key), _baseline(history, key, cfg)
        if now is None or base is None or base <= 0:
            continue
        if sev := _level(now / base, cfg.growth_warn, cfg.growth_critical):
            out.append(
                Alert(
                    _step(history),
                    "length_blowup",
                    sev,
                    f"{what} {now:.1f} is {now / base:.1f}x its baseline {base:.1f}",
                    now,
                    base * cfg.growth_warn,
                )
            )
    return out


def zero_variance(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    share = _now(history, "groups/zero_variance_share")
    if share is None:
        return []
    sev = (
        "critical"
        if share >= cfg.zero_variance_share_critical
        else ("warning" if share > cfg.zero_variance_share_warn else None)
    )
    return (
        [
            Alert(
                _step(history),
                "zero_variance",
                sev,
                f"{share:.0%} of groups have identical rewards (no learning signal: tasks too easy/hard?)",
                share,
                cfg.zero_variance_share_warn,
            )
        ]
        if sev
        else []
    )


def reward_flat(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    if _now(history, "reward/mean") is None:
        return []
    vals = [float(h["reward/mean"]) for h in history if h.get("reward/mean") is not None][-cfg.reward_flat_steps :]
    if len(vals) < cfg.reward_flat_steps or max(vals) - min(vals) >= cfg.reward_flat_eps:
        return []
    return [
        Alert(
            _step(history),
            "reward_flat",
            "warning",
            f"reward/mean stayed within {max(vals) - min(vals):.2g} for {cfg.reward_flat_steps} steps",
            vals[-1],
            cfg.reward_flat_eps,
        )
    ]


def staleness(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    s = _now(history, "policy/staleness_mean")
    if s is None or not (sev := _level(s, cfg.staleness_warn, cfg.staleness_critical)):
        return []
    return [
        Alert(
            _step(history),
            "staleness",
            sev,
            f"samples are {s:.1f} policy versions old on average",
            s,
            cfg.staleness_warn,
        )
    ]


def stale_drops(history: History, cfg: MonitorConfig, run: RunFacts) -> list[Alert]:
    dropped, n = _now(history, "async/dropped_stale"), _now(history, "rollout/count")
    if dropped is None or not n:
        return []
    share = dropped / n
    if not (sev := _level(share, cfg.stale_drop_share_warn, cfg.stale_drop_share_critical)):
        return []
    return [
        Alert(
            _step(history),
            "stale_drops",
            sev,
            f"{share:.0%} of the step's rollouts were older than run.max_staleness and dropped",
            share,
            cfg.stale_drop_share_warn,
        )
    ]


Monitor = Callable[[History, MonitorConfig, RunFacts], list[Alert]]
MONITORS: dict[str, Monitor] = {  # same order as MONITOR_NAMES (the config validates against that)
    "mismatch": mismatch,
    "infra_errors": infra_errors,
    "tamper": tamper,
    "tool_collapse": tool_collapse,
    "parse_failures": parse_failures,
    "length_blowup": length_blowup,
    "zero_variance": zero_variance,
    "reward_flat": reward_flat,
    "staleness": staleness,
    "stale_drops": stale_drops,
}


def evaluate(history: History, cfg: MonitorConfig | None = None, run: RunFacts | None = None) -> MonitorResult:
    """Run every enabled monitor on the latest step of `history`."""
    cfg, run = cfg or MonitorConfig(), run or RunFacts()
    result = MonitorResult()
    if not history:
        return result
    for name, fn in MONITORS.items():
        if name not in cfg.disabled:
            result.alerts += fn(history, cfg, run)
    for a in result.alerts:
        if a.severity == "critical" and (cfg.stop_on_critical or a.name in cfg.stop_on):
            result.should_stop = True
            result.stop_reasons.append(f"{a.name}: {a.message}")
    return result


def run_monitors(store: Any, cfg: MonitorConfig | None = None, step: int | None = None) -> MonitorResult:
    """Evaluate on the store's metric history (up to `step`) and its harnesses' action
    formats, store the alerts, and record a `run_stop_requested` event when the run should
    stop. `store` is a `RunStore`."""
    history = store.metrics_history()
    if step is not None:
        history = [h for h in history if h["step"] <= step]
    result = evaluate(history, cfg, RunFacts(store.action_formats()))
    for a in result.alerts:
        store.add_alert(a.step, a.name, a.severity, a.message, value=a.value, threshold=a.threshold)
    if result.should_stop:
        store.add_event("run_stop_requested", {"reasons": result.stop_reasons}, step=_step(history))
    return result


def describe_metrics() -> dict[str, str]:
    """The metric-key table of this module's docstring, as {key: meaning} (for docs and the UI)."""
    rows = [line.split("|") for line in (__doc__ or "").splitlines() if line.startswith("| `")]
    return {r[1].strip().strip("`"): r[2].strip() for r in rows}


def config_docs(cfg: type[BaseModel] = MonitorConfig) -> Mapping[str, str]:
    return {name: f.description or "" for name, f in cfg.model_fields.items()}
