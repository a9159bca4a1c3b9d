"""`legorl eval`'s results in the official SWE-bench harness's shapes, to compare with
published numbers: the run report (`make_run_report`'s keys, schema_version 2: resolved,
unresolved, empty-patch and error ids) and per-instance reports (`get_eval_report`'s
`patch_is_None/patch_exists/patch_successfully_applied/resolved/tests_status`, with
FAIL_TO_PASS/PASS_TO_PASS split into success and failure). An instance counts once, by its
first sample (the official harness grades one prediction per instance). A rollout masked
as infrastructure is an error instance, never unresolved.
"""

from __future__ import annotations

from typing import Any

from legorl.types import Outcome, Status, Task
from legorl.verify.junit import TestStatus


def instance_report(task: Task, outcome: Outcome) -> dict[str, Any]:
    """One instance as the official `get_eval_report` writes it."""
    applied = "patch_apply_failed" not in outcome.flags and outcome.status is not Status.NO_PATCH

    def split(ids: list[str]) -> dict[str, list[str]]:
        ok = [t for t in ids if TestStatus(outcome.tests.get(t, "missing")).ok]
        return {"success": ok, "failure": [t for t in ids if t not in ok]}

    return {
        "patch_is_None": False,
        "patch_exists": outcome.status is not Status.NO_PATCH,
        "patch_successfully_applied": applied and not outcome.masked,
        "resolved": outcome.status is Status.RESOLVED,
        "tests_status": {
            "FAIL_TO_PASS": split(task.FAIL_TO_PASS),
            "PASS_TO_PASS": split(task.PASS_TO_PASS),
            "FAIL_TO_FAIL": {"success": [], "failure": []},
            "PASS_TO_FAIL": {"success": [], "failure": []},
        },
    }


def run_report(tasks: list[Task], outcomes: dict[str, Outcome]) -> dict[str, Any]:
    """The run report of `make_run_report`, plus `instances` (the per-instance reports)."""
    ids = sorted(t.instance_id for t in tasks)
    done = {i: o for i, o in outcomes.items() if i in set(ids)}
    errors = sorted(i for i, o in done.items() if o.masked or o.status.is_infra)
    empty = sorted(i for i, o in done.items() if o.status is Status.NO_PATCH)
    completed = sorted(i for i in done if i not in errors and i not in empty)
    resolved = sorted(i for i in completed if done[i].status is Status.RESOLVED)
    by_id = {t.instance_id: t for t in tasks}
    return {
        "total_instances": len(ids),
        "submitted_instances": len(done),
        "completed_instances": len(completed),
        "resolved_instances": len(resolved),
        "unresolved_instances": len(completed) - len(resolved),
        "infra_failure_instances": len(errors),
        "ambiguous_failure_instances": 0,
        "empty_patch_instances": len(empty),
        "error_instances": len(errors),
        "completed_ids": completed,
        "incomplete_ids": sorted(set(ids) - set(done)),
        "empty_patch_ids": empty,
        "submitted_ids": sorted(done),
        "resolved_ids": resolved,
        "unresolved_ids": sorted(set(completed) - set(resolved)),
        "infra_failure_ids": errors,
        "ambiguous_failure_ids": [],
        "failure_reasons": {i: str(done[i].evidence.get("errors", ""))[:500] for i in errors},
        "error_ids": errors,
        "schema_version": 2,
        "instances": {i: instance_report(by_id[i], o) for i, o in sorted(done.items()) if i not in errors},
    }
