"""Grade an agent's diff in a fresh sandbox: the last stage of a rollout.

One attempt (`grade_in`) is five stages, each a module of its own, entered once, in order:
1. select (`selection.py`): the task's tests, the paths that protect them, the runner
   (pytest as SWE-bench selects its arguments, or Django's/SymPy's own) and the task test
   file the canaries go into; from the task alone;
2. prepare (`prepare.py`): the diff's size, its protected and binary sections dropped
   (evidence and flags), the grader's work directory in the fresh sandbox;
3. apply (`apply.py`): the filtered diff applied, every protected path the *tree* says
   changed put back (and checked), byte code deleted, the task's `test_patch` applied;
4. execute (`execute.py`): the tests under the supervised runner, canaries planted among
   the task's own tests; the summary and the report (or log) read back;
5. judge (`judge.py`): the channels that must agree (`verdict.py`, `native.py`) decide,
   and the verdict becomes the `Outcome`.
A stage that finds the grade decided by the agent's diff (it does not apply, a protected
path would not go back, the test patch conflicts) raises `Decided`; see `attempt.py`.

Failure classes: anything the agent's diff causes (does not apply, makes the task's
test_patch conflict, hangs or crashes the tests, fills the disk) is agent-caused and graded
0. A fault of the machinery (sandbox start, lost sandbox, a task whose test_patch does not
apply even to the untouched tree) raises `GraderFault`/`SandboxError`; `grade()` returns
them as a masked `infra_error` (the rollout worker retries the whole rollout).

One rule decides whose a claimed fault is: a fault that may follow from the agent's diff or
code is confirmed before it masks. Once the diff reaches the tree (the apply stage on), every
would-be grader fault (a lost sandbox, a timed-out apply or restore, a runner that says it
could not prepare, canaries that cannot vouch, a log the official parser chokes on) can be
the diff's or its code's doing, so a control attempt with the empty diff decides: when it
completes, the machinery works and the outcome is the agent's, reward 0 with the fault's
class as flag (`GraderFault.flag`; `grader_sandbox_killed` for a lost sandbox). Only when
the control fails too is the fault masked. The control costs one more grading attempt, and
only when a fault is claimed (docs/architecture.md, "Grading").

`grade()` is that wrapper for every task kind (`tasks/kinds/`): the kind says which fresh
sandbox an attempt runs in, runs the attempt (`grade_in` here for SWE-bench-format rows,
`state_grade.grade_in` for Harbor tasks), which of its steps put the agent's changes in play
(`diff_in`) and whether the changes are empty; every kind gets the `GradeConfig`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from legorl.sandbox.base import Backend, Sandbox, SandboxError
from legorl.tasks.kinds import kind_of
from legorl.types import Outcome, Status, Task
from legorl.verify.apply import apply
from legorl.verify.attempt import Attempt, Decided, GradeConfig, GraderFault
from legorl.verify.execute import execute
from legorl.verify.judge import judge_run
from legorl.verify.prepare import prepare
from legorl.verify.selection import select

if TYPE_CHECKING:
    from legorl.tasks.kinds.base import TaskKind

__all__ = ["GradeConfig", "GraderFault", "grade", "grade_in"]


async def grade_in(
    sb: Sandbox, task: Task, diff: str, cfg: GradeConfig, state: dict[str, str] | None = None
) -> Outcome:
    """One grading attempt in a fresh sandbox `sb`: the five stages, in order. Raises
    GraderFault/SandboxError on infra faults.

    `state["step"]` tells the caller how far it got (`"apply"` once the agent's diff goes
    into the tree, `"tests"` while the agent's code runs).
    """
    a = Attempt(task, cfg, state if state is not None else {})
    a.state["step"] = "prepare"
    a.ev["diff_bytes"] = len(diff.encode())
    try:
        sel = select(task)
        ws = await prepare(sb, a, sel, diff)
        a.state["step"] = "apply"  # from here on a fault may be the diff's or its code's doing
        applied = await apply(sb, a, ws)
        run = await execute(sb, a, sel, ws, applied)
        return judge_run(a, run)
    except Decided as early:
        return early.outcome


async def grade(
    task: Task, diff: str, backend: Backend, image: str, cfg: GradeConfig | None = None, kind: TaskKind | None = None
) -> Outcome:
    """Grade `diff` (the agent's changes) for `task` in a fresh sandbox from `image`: one
    attempt, through the task's `kind` (chosen from the task when not given). A fault of ours
    is a masked `infra_error` (the rollout worker, the one owner of retries, runs the whole
    rollout again in a fresh sandbox and session); when the fault may be the changes' doing,
    a control attempt with no changes decides whose it was."""
    kind = kind or kind_of(task)
    cfg = cfg or GradeConfig()
    outcome, err, flag = await _attempt(kind, diff, backend, image, cfg)
    if outcome is not None:
        return outcome
    errors = [err]
    if flag and not kind.is_empty(diff):
        t0 = time.monotonic()
        control, cerr, _ = await _attempt(kind, "", backend, image, cfg)
        if control is not None:  # the machinery works on the untouched tree: the diff or its code did it
            evidence = {"errors": errors, "control": control.status.value, "control_s": round(time.monotonic() - t0, 3)}
            return Outcome(0.0, Status.FAILED, flags=[flag], evidence=evidence)
        errors.append(f"control: {cerr}")
    return Outcome(
        0.0, Status.INFRA_ERROR, masked=True, evidence={"cause": Status.GRADER_ERROR.value, "errors": errors}
    )


async def _attempt(
    kind: TaskKind, diff: str, backend: Backend, image: str, cfg: GradeConfig
) -> tuple[Outcome | None, str, str]:
    """(outcome, "", "") or (None, error text, flag): the flag the fault is graded as should
    the control run clean; "" when it cannot follow from the diff or its code (it came before
    the diff reached the tree, or from the task alone)."""
    try:
        sb = await backend.start(kind.grade_sandbox(image, cfg))
    except SandboxError as exc:
        return None, f"{Status.SANDBOX_START_FAILED.value}: {exc}", ""
    state: dict[str, str] = {}
    try:
        async with sb:
            try:
                return await kind.grade_in(sb, diff, cfg, state), "", ""
            except GraderFault as exc:
                return None, f"{Status.GRADER_ERROR.value}: {exc}", exc.flag if _diff_in(kind, state) else ""
            except SandboxError as exc:
                step = state.get("step", "prepare")
                killed = "grader_sandbox_killed" if _diff_in(kind, state) else ""
                return None, f"{Status.GRADER_ERROR.value}: sandbox lost during {step}: {exc}", killed
    except SandboxError as exc:  # closing failed
        killed = "grader_sandbox_killed" if _diff_in(kind, state) else ""
        return None, f"{Status.GRADER_ERROR.value}: close failed: {exc}", killed


def _diff_in(kind: TaskKind, state: dict[str, str]) -> bool:
    """Had the attempt put the agent's changes in play (the kind says from which step on)?"""
    return kind.diff_in(state.get("step", "prepare"))
