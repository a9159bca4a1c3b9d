"""The pre-flight's load check: can this machine start `max_concurrent_rollouts` harnesses at
once and still leave each rollout its `agent_timeout_s`?

Why: a harness runtime spends CPU before it asks the model anything (OpenCode's Bun binary
~3.7 CPU-s, the OpenHands SDK in the sandbox ~10 s of imports; docs/measured.md). When N
rollouts start together on C cores, each waits about `cost × N / C` seconds for that start
alone. A rollout that runs past `agent_timeout_s` is the agent's outcome (reward 0, and it is
trained on), so a machine too loaded for its concurrency teaches the policy that its fixes
fail for a reason that is ours. Measured: 32 OpenCode rollouts at once on two cores ran 6% of
an evaluation past the 180 s timeout; 16 at once ran none.

The cost is read where it is free: the window pre-flight (`loop/window.py`) already starts
each harness once. Its child processes' CPU (`getrusage(RUSAGE_CHILDREN)` around the probe
rollout: the sandbox zygote and everything it forked, counted when the probe's backend closes)
is one start, one first prompt and one reply, plus one empty sandbox (~0.1 CPU-s). The run
warns, on the console and as a `warning` alert the UI lists, when that start alone would take
more than a third of the timeout (`SHARE_OF_TIMEOUT`: the measured OpenCode timeouts began
between 16 × 7 / 2 = 56 s and 32 × 7 / 2 = 112 s), and names the concurrency that would not.
A warning, not a refusal: the estimate ignores the engine's share of the cores (so it is
low) and assumes every rollout starts at once (so it is high).

Not measured, so never warned about: warm drivers (`*-warm`: the harness starts once, beside
the sandboxes), the docker backend (the harness is the daemon's child, not ours) and Ray
rollout workers (their cores are not this process's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from legorl.loop.config import RunConfig
from legorl.loop.window import FirstPrompt

SHARE_OF_TIMEOUT = 1 / 3


@dataclass(frozen=True)
class StartLoad:
    """One harness's start cost against this machine's concurrency and timeout."""

    harness: str
    cpu_s: float  # CPU-seconds of the harness's own processes for the probe's one-turn rollout
    concurrent: int
    cores: int
    agent_timeout_s: float

    @property
    def wait_s(self) -> float:
        """Seconds each of `concurrent` simultaneous starts waits for the cores."""
        return self.cpu_s * self.concurrent / self.cores

    @property
    def limit_s(self) -> float:
        return SHARE_OF_TIMEOUT * self.agent_timeout_s

    @property
    def over(self) -> bool:
        return self.wait_s > self.limit_s

    @property
    def safe_concurrency(self) -> int:
        """The most rollouts at once whose starts stay within the share of the timeout."""
        if self.cpu_s <= 0:
            return self.concurrent
        return max(1, int(self.limit_s * self.cores / self.cpu_s))

    def message(self) -> str:
        return (
            f"harness {self.harness!r} costs {self.cpu_s:.1f} CPU-s to start and answer once (the pre-flight's "
            f"probe); {self.concurrent} rollouts at once on {self.cores} cores wait ~{self.wait_s:.0f} s for that "
            f"alone, over a third of sandbox.agent_timeout_s = {self.agent_timeout_s:g}: rollouts will run out of "
            f"time on this machine's load, and a timeout counts as the agent's. Lower run.max_concurrent_rollouts "
            f"to {self.safe_concurrency} or fewer, or raise sandbox.agent_timeout_s"
        )


def measurable(cfg: RunConfig, harness: str) -> bool:
    """Whether the probe's child CPU is this harness's per-rollout start on this machine."""
    return cfg.sandbox.backend == "local" and not cfg.ray.enabled and not harness.endswith("-warm")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def start_loads(cfg: RunConfig, cpu_s: dict[str, float], cores: int | None = None) -> list[StartLoad]:
    """The load of each measurable harness's start at the run's concurrency."""
    r = cfg.run
    widest = max(r.tasks_per_step * r.group_size, cfg.heldout.tasks or 0, cfg.warm_start.episodes or 0)
    concurrent = max(1, min(r.max_concurrent_rollouts, widest))  # a step, an evaluation or the demonstrations
    n = cores or usable_cores()
    return [
        StartLoad(name, s, concurrent, n, cfg.sandbox.agent_timeout_s)
        for name, s in cpu_s.items()
        if measurable(cfg, name)
    ]


def overloads(cfg: RunConfig, firsts: Mapping[str, FirstPrompt]) -> list[StartLoad]:
    """The harnesses whose probed starts would eat the timeout at the run's concurrency."""
    return [ld for ld in start_loads(cfg, {n: fp.cpu_s for n, fp in firsts.items()}) if ld.over]
