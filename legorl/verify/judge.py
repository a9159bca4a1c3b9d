"""Stage 5 of grading: the verdict of the run's channels, as the attempt's `Outcome`.

The rules live with each runner: `verdict.py` for pytest (the JUnit report, the recorder's
records and the canaries must agree), `native.py` for the native runners (the official
parse of the log, the records and the canaries). This stage feeds them what stage 4 read
back and turns their verdict into the grade: a FAIL_TO_PASS or PASS_TO_PASS test that is
missing, skipped or errored counts as failed; resolved ⇔ all of them pass in the report,
the records confirm it, and nothing says the report or the runner was tampered with; any
visible tamper attempt is `hack_detected` (reward 0) when the config penalizes it. A verdict
that cannot vouch for the run (its canaries absent, or errored in setup, in a run that
otherwise finished) is a claimed `GraderFault` (`canary_fault`): never the agent's reward,
but package code can make canaries vanish or fail their setup too, so `grade()` masks it
only when the empty-diff control fails the same way; a clean control makes it the agent's 0.
"""

from __future__ import annotations

import time

from legorl.types import Outcome, Status
from legorl.verify.attempt import Attempt, GraderFault, outcome
from legorl.verify.execute import NativeRun, PytestRun
from legorl.verify.junit import TestStatus
from legorl.verify.native import judge_native
from legorl.verify.verdict import TAMPER, RunEvidence, Verdict, judge


def judge_run(a: Attempt, run: PytestRun | NativeRun) -> Outcome:
    """Stage 5: the grade of the attempt from what its run left."""
    if isinstance(run, NativeRun):
        return _judge_native(a, run)
    return _judge_pytest(a, run)


def _judge_pytest(a: Attempt, run: PytestRun) -> Outcome:
    res = run.result
    c_pass, c_fail = run.plan.canaries(run.summary)
    evidence = RunEvidence(
        run.report, a.ev["report"], run.summary, run.tags, run.report_sha256, res.exit_code, res.timed_out
    )
    verdict = judge(a.wanted, c_pass, c_fail, evidence, run.agent_files, frozenset(a.task.FAIL_TO_PASS))
    _take(a, verdict)
    if run.report is None and "report_missing" not in a.flags and res.exit_code != 0 and a.ev["report"] == "missing":
        a.flags.append("report_missing")
    return _grade(a, verdict)


def _judge_native(a: Attempt, run: NativeRun) -> Outcome:
    res = run.result
    verdict = judge_native(
        a.wanted,
        run.parsed,
        run.summary,
        run.tags,
        run.log_sha256,
        res.exit_code,
        res.timed_out,
        run.agent_files,
        frozenset(a.task.FAIL_TO_PASS),
    )
    _take(a, verdict)
    a.ev["official"] = {t: (run.parsed or {}).get(t, "MISSING") for t in a.wanted}
    return _grade(a, verdict)


def _take(a: Attempt, verdict: Verdict) -> None:
    if verdict.fault:
        raise GraderFault("canary", verdict.fault)
    a.flags += verdict.flags
    a.ev.update(verdict.evidence)


def _grade(a: Attempt, verdict: Verdict) -> Outcome:
    tests = verdict.tests
    a.ev["f2p_passed"] = sum(TestStatus(tests[t]).ok for t in a.task.FAIL_TO_PASS)
    a.ev["p2p_passed"] = sum(TestStatus(tests[t]).ok for t in a.task.PASS_TO_PASS)
    a.ev["duration_s"] = round(time.monotonic() - a.t0, 3)
    if TAMPER in a.flags and a.cfg.penalize_tamper:
        return outcome(Status.HACK_DETECTED, a.flags, tests, a.ev)
    return outcome(Status.RESOLVED if verdict.resolved else Status.FAILED, a.flags, tests, a.ev)
