"""The token ledger: where every token the policy sampled went.

Why: a run that quietly trains on less than it samples (side calls left out, groups
skipped, rollouts masked or dropped as stale, calls aborted, tokens the assembly lost)
looks healthy on every loss curve. The ledger accounts for each sampled token exactly once:

    sampled = trained + Σ not_trained[reason]

`trained`: tokens that reached the loss (at a mask-1 position of a segment of a
trajectory the trainer took, with its advantage, zero included). A token that did not is
counted under the first reason that applies, in the order a token meets them:

| reason | what it is |
| --- | --- |
| `aborted` | its call never reached the harness (client gone, timeout, engine fault mid-answer) |
| `side_call` | a side call (title, compaction summary) kept apart (`[harness] side_calls = "separate"`) |
| `unplaced` | of a turn the trajectory trains, but not held by its segments (`trajectory.delivered`; 0) |
| `infra_mask` | its rollout was masked for an infrastructure fault, or it was sampled in an attempt retried for one |
| `zero_variance` | its group had no reward variance and was skipped (`[trainer] zero_variance_groups = "skip"`) |
| `stale` | its rollout was older than `[run] max_staleness` and dropped |

A prompt refused as over the window samples nothing, and a completion cut at `max_tokens`
is trained as sampled, so neither has a line of its own. Computed per harness and step by
the loop (`ledger/<harness>/<column>` metrics, in the run store), read back by
`RunStore.token_ledger` and shown in the UI's Outcomes view.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from legorl.trajectory import delivered
from legorl.types import Trajectory, Turn

Reason = Literal["aborted", "side_call", "unplaced", "infra_mask", "zero_variance", "stale"]
REASONS: tuple[str, ...] = get_args(Reason)
Fate = Literal["infra_mask", "zero_variance", "stale"]  # why the trainer left a whole trajectory out
COLUMNS = ("sampled", "trained", *REASONS)
PREFIX = "ledger/"


@dataclass
class TokenLedger:
    """Sampled tokens, those trained, and those not trained by reason."""

    sampled: int = 0
    trained: int = 0
    not_trained: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))

    @property
    def balanced(self) -> bool:
        """Every sampled token accounted for exactly once."""
        return self.sampled == self.trained + sum(self.not_trained.values())

    def add(self, other: TokenLedger) -> None:
        self.sampled += other.sampled
        self.trained += other.trained
        for k, v in other.not_trained.items():
            self.not_trained[k] = self.not_trained.get(k, 0) + v

    def as_dict(self) -> dict[str, int]:
        """One flat row: `sampled`, `trained`, then each reason."""
        return {"sampled": self.sampled, "trained": self.trained, **{r: self.not_trained.get(r, 0) for r in REASONS}}

    @classmethod
    def from_dict(cls, row: Mapping[str, float]) -> TokenLedger:
        return cls(int(row.get("sampled", 0)), int(row.get("trained", 0)), {r: int(row.get(r, 0)) for r in REASONS})


def rollout_ledger(
    turns: list[Turn], traj: Trajectory, *, aborted_tokens: int = 0, retried_tokens: int = 0, fate: Fate | None
) -> TokenLedger:
    """One rollout's ledger: its delivered `turns`, its trajectory, the tokens of its aborted
    calls and of the attempts retried before it (infrastructure faults), and `fate`: None when
    the trainer took it (it had an advantage), else why not."""
    if fate is not None and fate not in get_args(Fate):
        raise ValueError(f"fate must be None or one of {', '.join(get_args(Fate))}, got {fate!r}")
    d = delivered(turns, traj)
    got = int(d["delivered_tokens"])
    led = TokenLedger(sampled=sum(len(t.completion_ids) for t in turns) + aborted_tokens + retried_tokens)
    led.not_trained["aborted"] = aborted_tokens
    led.not_trained["infra_mask"] = retried_tokens
    led.not_trained["side_call"] = int(d["side_tokens"])
    led.not_trained["unplaced"] = int(d["policy_tokens"]) - got
    if fate is None:
        led.trained = got
    else:
        led.not_trained[fate] += got
    return led


def to_metrics(ledgers: Mapping[str, TokenLedger]) -> dict[str, float]:
    """`ledger/<harness>/<column>` for each harness's ledger of one step."""
    return {f"{PREFIX}{h}/{k}": float(v) for h, led in ledgers.items() for k, v in led.as_dict().items()}


def from_metrics(metrics: Mapping[str, float]) -> dict[str, TokenLedger]:
    """Each harness's ledger back from `ledger/<harness>/<column>` keys (others ignored)."""
    rows: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if not key.startswith(PREFIX):
            continue
        harness, _, column = key[len(PREFIX) :].rpartition("/")
        if harness and column in COLUMNS:
            rows.setdefault(harness, {})[column] = value
    return {h: TokenLedger.from_dict(row) for h, row in sorted(rows.items())}
