"""Known failure signatures of a run, matched against its store's metric history.

Why named signatures: "is my run healthy?" has a handful of answers that recur across RL
runs on agents, each with a shape in the metrics and a fix. Each signature here reads a few
metric keys, decides with the run's own monitor thresholds (the runtime monitors of
`legorl.monitor.monitors` are called, not re-implemented, wherever one computes the thing),
and returns the evidence it read, so a report never states a cause it did not see. Where no
monitor exists (learning rate, gradient norm, held-out vs training, the stall) the rule is
here and says so.

| key | name | reads |
| --- | --- | --- |
| `mismatch` | rollout/trainer mismatch | `mismatch` monitor: `mismatch/pearson`, `/mean_abs_dp` |
| `lr_zero` | learning rate 0 | `train/lr` of the last trained steps (the next step's lr) |
| `gradient_starvation` | gradient starvation | `train/grad_norm`, `train/trained`, zero-variance share, 3 steps |
| `infra_avalanche` | infrastructure avalanche | `infra_errors` monitor: `status/<infra>`, share climbing |
| `heldout_fake_zero` | held-out fake-zero | `heldout/*/resolved_rate` at 0, training `resolved_rate`/`reward/mean` |
| `tool_collapse` | tool-call collapse | `rollout/turns_mean` → 1, `rollout/parse_failure_rate` rising |
| `zero_variance` | zero-variance starvation | `zero_variance` monitor critical on each of the last 3 steps |
| `stall` | stall | the process alive, the store's last write older than the limit |
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from legorl.monitor import monitors as mon
from legorl.types import INFRA_STATUSES

SUSTAIN = 3  # steps a starvation must last to be one (one step without signal is ordinary)
GRAD_EPS = 1e-12  # a gradient norm at or below this is no gradient
HELDOUT_TRAIN_MIN = 0.2  # training resolved rate (or reward) that counts as "fine"
ONE_TURN = 1.5  # mean policy turns at or below this is "turns → 1"


@dataclass(frozen=True)
class Facts:
    """What the signatures read: the run's metric history (one dict per step, ascending, from
    `RunStore.metrics_history()`), its monitor thresholds and harness action formats, and
    the live facts `legorl status` gathered (process, age of the last write)."""

    history: Sequence[Mapping[str, float]]
    monitor: mon.MonitorConfig = field(default_factory=mon.MonitorConfig)
    run: mon.RunFacts = field(default_factory=mon.RunFacts)
    alive: bool | None = None
    last_write_age_s: float | None = None
    stall_after_s: float = 900.0
    steps_planned: int | None = None  # `[run] steps` of the run's config


@dataclass(frozen=True)
class Match:
    """One signature that fits, with the evidence it read and what to do."""

    key: str
    name: str
    severity: str  # warning | critical
    evidence: list[str]
    fix: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _steps(h: Sequence[Mapping[str, float]], key: str) -> list[Mapping[str, float]]:
    """The steps (≥ 0; the warm start is step -1) that logged `key`."""
    return [s for s in h if s.get("step", 0) >= 0 and key in s and math.isfinite(float(s[key]))]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _series(rows: Sequence[Mapping[str, float]], key: str) -> str:
    return ", ".join(f"step {int(r['step'])}: {_fmt(float(r[key]))}" for r in rows)


def mismatch(f: Facts) -> Match | None:
    rows = _steps(f.history, "mismatch/pearson")
    if not rows:
        return None
    upto = [s for s in f.history if s["step"] <= rows[-1]["step"]]
    alerts = mon.mismatch(upto, f.monitor, f.run)
    if not alerts:
        return None
    sev = "critical" if any(a.severity == "critical" for a in alerts) else "warning"
    return Match(
        "mismatch",
        "rollout/trainer mismatch",
        sev,
        [f"step {a.step}: {a.message}" for a in alerts]
        + [f"mismatch/pearson: {_series(rows[-3:], 'mismatch/pearson')}"],
        "the trainer is not computing what the engine sampled: check routing replay (MoE), dtypes, the engine's "
        "logprobs mode and the served weights (`legorl doctor` checks each)",
    )


def lr_zero(f: Facts) -> Match | None:
    """`train/lr` is what the *next* optimizer step uses (logged after the scheduler stepped),
    so a cosine schedule that ends with the run logs 0 on its last step, harmlessly. A match
    needs a step that trained at 0 (two zeros in a row) or a zero with steps still to come."""
    rows = [s for s in _steps(f.history, "train/lr") if s.get("train/trained", 1.0) > 0]
    if not rows or rows[-1]["train/lr"] > 0:
        return None
    more_to_come = f.steps_planned is None or rows[-1]["step"] < f.steps_planned - 1
    if not more_to_come and not (len(rows) > 1 and rows[-2]["train/lr"] <= 0):
        return None
    return Match(
        "lr_zero",
        "learning rate 0",
        "critical",
        [f"train/lr: {_series(rows[-3:], 'train/lr')}"],
        "set [trainer] lr > 0 and total_steps ≥ the run's optimizer steps; resume from the last checkpoint",
    )


def gradient_starvation(f: Facts) -> Match | None:
    rows = _steps(f.history, "train/trained")[-SUSTAIN:]
    if not rows:
        return None
    starved = [r for r in rows if r["train/trained"] <= 0 or r.get("train/grad_norm", 0.0) <= GRAD_EPS]
    explained = all(r.get("groups/zero_variance_share", 0.0) >= 1.0 for r in rows)  # zero_variance's, not ours
    if len(starved) < len(rows) or explained:
        return None
    ev = [
        f"step {int(r['step'])}: trained {int(r['train/trained'])}, grad_norm {_fmt(r.get('train/grad_norm', 0.0))}, "
        f"zero-variance groups {r.get('groups/zero_variance_share', float('nan')):.0%}, "
        f"trained trajectories {int(r.get('groups/trained_trajectories', 0))}"
        for r in rows
    ]
    return Match(
        "gradient_starvation",
        "gradient starvation",
        "critical",
        ev,
        "groups carry reward variance but no gradient reaches the weights: check that completion tokens are "
        "not all masked (trajectory view), the advantages (stored per trajectory) and [trainer] max_grad_norm",
    )


def _infra_share(s: Mapping[str, float]) -> float:
    return sum(float(s.get(f"status/{x.value}", 0.0)) for x in INFRA_STATUSES)


def infra_avalanche(f: Facts) -> Match | None:
    rows = [s for s in f.history if s.get("step", 0) >= 0 and any(f"status/{x.value}" in s for x in INFRA_STATUSES)]
    if not rows:
        return None
    alerts = mon.infra_errors(rows, f.monitor, f.run)
    shares = [_infra_share(r) for r in rows]
    climbing = len(shares) < 2 or shares[-1] >= max(shares[:-1])
    if not alerts or not climbing:
        return None
    return Match(
        "infra_avalanche",
        "infrastructure avalanche",
        alerts[0].severity,
        [f"step {a.step}: {a.message}" for a in alerts]
        + [
            "masked (infrastructure) share: "
            + ", ".join(f"step {int(r['step'])}: {s:.0%}" for r, s in zip(rows[-5:], shares[-5:], strict=True))
        ],
        "rollouts are masked, not learned from: read the infra_error trajectories' evidence (sandbox, engine, "
        "grader), fix the machine (`legorl doctor`), then resume",
    )


def heldout_fake_zero(f: Facts) -> Match | None:
    rates = [(k, s) for s in f.history for k in s if k.startswith("heldout/") and k.endswith("/resolved_rate")]
    if not rates:
        return None
    key, last = max(rates, key=lambda ks: (ks[1]["step"], ks[0]))
    if last[key] > 0:
        return None
    train = [r for r in f.history if r.get("step", 0) >= 0 and ("resolved_rate" in r or "reward/mean" in r)][-5:]
    fine = [max(r.get("resolved_rate", 0.0), r.get("reward/mean", 0.0)) for r in train]
    if not fine or sum(fine) / len(fine) < HELDOUT_TRAIN_MIN:
        return None
    label = key[len("heldout/") : -len("/resolved_rate")]
    eps, masked = last.get(f"heldout/{label}/episodes", 0.0), last.get(f"heldout/{label}/masked", 0.0)
    return Match(
        "heldout_fake_zero",
        "held-out fake-zero",
        "critical",
        [
            f"step {int(last['step'])}: {key} = 0 over {int(eps)} episodes ({int(masked)} masked)",
            f"training resolved rate / reward over the last {len(fine)} steps: " + ", ".join(f"{v:.2f}" for v in fine),
        ],
        "a held-out 0 beside a working training split is the evaluation's failure, not the policy's: read the "
        "held-out trajectories (statuses, flags: context_exceeded, harness exits) and the held-out split's tasks",
    )


def tool_collapse(f: Facts) -> Match | None:
    rows = _steps(f.history, "rollout/turns_mean")
    if len(rows) < 2:
        return None
    turns = [r["rollout/turns_mean"] for r in rows]
    fails = [r.get("rollout/parse_failure_rate", 0.0) for r in rows]
    before = sum(turns[:-1]) / len(turns[:-1])
    rising = fails[-1] > sum(fails[:-1]) / len(fails[:-1])
    if not (turns[-1] <= ONE_TURN < before and rising):
        return None
    upto = [s for s in f.history if s["step"] <= rows[-1]["step"]]
    alerts = mon.tool_collapse(upto, f.monitor, f.run) + mon.parse_failures(upto, f.monitor, f.run)
    return Match(
        "tool_collapse",
        "tool-call collapse",
        "critical",
        [
            f"rollout/turns_mean: {_series(rows[-5:], 'rollout/turns_mean')}",
            "rollout/parse_failure_rate: "
            + ", ".join(f"step {int(r['step'])}: {v:.0%}" for r, v in zip(rows[-5:], fails[-5:], strict=True)),
        ]
        + [f"step {a.step}: {a.message}" for a in alerts],
        f"the policy stopped acting in its harness's format ({f.run.format_label()}): inspect recent turns; "
        "roll back to a checkpoint before the collapse and lower the learning rate or add format demonstrations",
    )


def zero_variance(f: Facts) -> Match | None:
    rows = [s for s in f.history if s.get("step", 0) >= 0 and "groups/zero_variance_share" in s][-SUSTAIN:]
    if len(rows) < SUSTAIN:
        return None
    hits = [mon.zero_variance([r], f.monitor, f.run) for r in rows]
    if not all(h and h[0].severity == "critical" for h in hits):
        return None
    return Match(
        "zero_variance",
        "zero-variance starvation",
        "critical",
        [f"step {h[0].step}: {h[0].message}" for h in hits],
        "every group's rewards are equal, so no advantage is non-zero: tasks are all too hard or all too easy "
        "for this policy; change the task mix or difficulty, or the group size",
    )


def stall(f: Facts) -> Match | None:
    if f.alive is not True or f.last_write_age_s is None or f.last_write_age_s <= f.stall_after_s:
        return None
    return Match(
        "stall",
        "stall",
        "critical",
        [
            f"the run's process is alive; its store's last write was {f.last_write_age_s / 60:.0f} min ago "
            f"(limit {f.stall_after_s / 60:.0f} min)"
        ],
        "something waits forever (an engine request, a sandbox, a harness): look at the process (py-spy dump) and "
        "the newest trajectories; a hang should be an error with a message, so report it",
    )


SIGNATURES: dict[str, Callable[[Facts], Match | None]] = {
    "mismatch": mismatch,
    "lr_zero": lr_zero,
    "gradient_starvation": gradient_starvation,
    "infra_avalanche": infra_avalanche,
    "heldout_fake_zero": heldout_fake_zero,
    "tool_collapse": tool_collapse,
    "zero_variance": zero_variance,
    "stall": stall,
}


def match(f: Facts) -> list[Match]:
    """Every signature that fits, in the table's order."""
    return [m for fn in SIGNATURES.values() if (m := fn(f)) is not None]
