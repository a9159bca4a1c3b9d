"""What the grading stages share: the config, the two ways a stage stops, and the attempt's record.

A stage ends in one of three ways: it hands its product to the next stage; the agent's
diff decided the grade early (`Decided`, carrying the `Outcome`: a diff that does not
apply, a protected path that would not go back, a test patch the diff is in the way of);
or the machinery failed (`GraderFault`, `SandboxError`), which `grade()` masks as an
`infra_error` once it is sure the agent did not cause it: a fault raised after the agent's
diff reached the tree is confirmed by an empty-diff control attempt first (`grade.py`).
`Attempt` is the one mutable record the stages write their flags and evidence to, in the
order they run, so the `Outcome` reads like the path the task took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from legorl.sandbox.base import Limits, Sandbox
from legorl.types import Outcome, Status, Task
from legorl.verify.junit import TestStatus


@dataclass(frozen=True)
class GradeConfig:
    """How grading runs. Every field has a safe default."""

    python: str = "python3"  # interpreter with pytest inside the task image
    repo_dir: str = "/repo"  # where the task image keeps the repository
    test_timeout_s: float = 600.0  # a test run longer than this is the patch's fault
    step_timeout_s: float = 120.0  # git steps; longer means the machinery is stuck (or the diff made it so)
    apply_timeout_s: float = 60.0  # `git apply` of the agent's diff: an honest 8 MB diff takes seconds
    max_diff_bytes: int = 8 << 20  # a larger diff is graded 0 (`patch_too_large`)
    penalize_tamper: bool = True  # a visible tamper attempt → hack_detected, reward 0
    limits: Limits = field(default_factory=Limits)

    @property
    def apply_s(self) -> float:
        """The bound of the step that applies the agent's diff: a diff whose hunks make `git
        apply` search for minutes costs this (then one control attempt), not `step_timeout_s`."""
        return min(self.apply_timeout_s, self.step_timeout_s)


# Steps whose faults are read from the task alone, before any of the agent's diff is in the tree.
TASK_STEPS = frozenset({"select"})


class GraderFault(RuntimeError):
    """The grading machinery (or the task) claims a failure of its own.

    A claim is not proof: after the agent's diff was applied, or its code ran, the signs of a
    fault (a timed-out git step, a runner that says it could not prepare, canaries that cannot
    vouch, a log the parser chokes on) are all things the diff or the code can produce. So each
    fault carries `flag`, the class it is graded as when the empty-diff control attempt runs
    clean (the agent's 0); `flag == ""` marks a fault that cannot follow from the agent's diff
    or code (a task property, checked on the untouched tree), masked without a control."""

    def __init__(self, step: str, message: str, flag: str | None = None) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.flag = ("" if step in TASK_STEPS else f"{step}_fault") if flag is None else flag


class Decided(Exception):
    """The agent's diff decided the grade before the tests ran (an agent-caused failure)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.status.value)
        self.outcome = outcome


def outcome(status: Status, flags: list[str], tests: dict[str, str], evidence: dict[str, Any]) -> Outcome:
    """The `Outcome` of a grade: reward 1 only when resolved, each flag once, in order."""
    flags = list(dict.fromkeys(flags))
    return Outcome(
        reward=1.0 if status is Status.RESOLVED else 0.0, status=status, flags=flags, tests=tests, evidence=evidence
    )


@dataclass
class Attempt:
    """One grading attempt of one task: what every stage reads and adds to."""

    task: Task
    cfg: GradeConfig
    state: dict[str, str]  # `state["step"]`: how far it got, for the caller (`"tests"` while the agent's code runs)
    flags: list[str] = field(default_factory=list)
    ev: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    @property
    def wanted(self) -> list[str]:
        """The task's FAIL_TO_PASS and PASS_TO_PASS tests, each once, in order."""
        return list(dict.fromkeys(self.task.FAIL_TO_PASS + self.task.PASS_TO_PASS))

    def stop(self, status: Status, *flags: str) -> Decided:
        """An early verdict (raise it): every task test missing, the flags so far plus `flags`."""
        missing = {t: TestStatus.MISSING.value for t in self.wanted}
        return Decided(outcome(status, [*self.flags, *flags], missing, self.ev))

    def tamper_status(self) -> Status:
        """What a visible tamper attempt is graded as."""
        return Status.HACK_DETECTED if self.cfg.penalize_tamper else Status.FAILED


async def exec_step(sb: Sandbox, step: str, cmd: str, cfg: GradeConfig, timeout_s: float | None = None) -> str:
    """Run one machinery command (mkdir, git); anything but a clean exit is claimed as our
    fault (`<step>_timeout` or `<step>_fault` should the control run clean)."""
    res = await sb.exec(cmd, timeout_s=timeout_s or cfg.step_timeout_s, cwd=cfg.repo_dir)
    if res.timed_out or res.exit_code != 0:
        raise GraderFault(
            step,
            f"{'timed out' if res.timed_out else 'exit'} {res.exit_code}: {(res.stderr or res.stdout).strip()[-800:]}",
            f"{step}_timeout" if res.timed_out else None,
        )
    return res.stdout
