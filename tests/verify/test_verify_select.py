"""Test selection with SWE-bench semantics, its load-time check, and the three-channel
verdict on hand-made evidence (no sandboxes)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from legorl.tasks.loader import TaskFileError, load_tasks
from legorl.types import Task
from legorl.verify.junit import TestStatus
from legorl.verify.selection import (
    patch_directives,
    select_tests,
    selection_problems,
    split_args,
)
from legorl.verify.verdict import RunEvidence, judge

TEST_PATCH = (
    "diff --git a/tests/test_new.py b/tests/test_new.py\n--- a/tests/test_new.py\n+++ b/tests/test_new.py\n@@ -1 +1 "
    "@@\n-a\n+b\n"
    "diff --git a/tests/data/cases.json b/tests/data/cases.json\n--- a/tests/data/cases.json\n+++ "
    "b/tests/data/cases.json\n"
    "@@ -1 +1 @@\n-a\n+b\n"
)
TASK = Task(
    "o__r-1",
    "o/r",
    "abc1234",
    "fix",
    "",
    TEST_PATCH,
    ["tests/test_a.py::test_x", "tests/test_a.py::TestK::test_y[1]"],
    ["tests/test_b.py::test_z"],
)


def with_cmd(cmd: str, **over: object) -> Task:
    return dataclasses.replace(TASK, test_cmd=cmd, **over)  # type: ignore[arg-type]


def test_split_args_keeps_option_values_out_of_paths() -> None:
    flags, paths = split_args(
        ["-o", "addopts=", "-k", "not slow", "-rA", "--tb=long", "-p", "no:warnings", "t.py", "d/"]
    )
    assert flags == ["-o", "addopts=", "-k", "not slow", "-rA", "--tb=long", "-p", "no:warnings"]
    assert paths == ["t.py", "d/"]


@pytest.mark.parametrize(
    "cmd", ["", "pytest", "python -m pytest -q", "python3 -m pytest -rA --tb=long -p no:cacheprovider"]
)
def test_without_paths_the_task_tests_are_the_directives(cmd: str) -> None:
    sel = select_tests(with_cmd(cmd))
    assert sel.directives == ["tests/test_a.py", "tests/test_b.py", "tests/test_new.py"] and not sel.from_test_cmd
    assert sel.args[: len(sel.flags)] == sel.flags
    assert selection_problems(with_cmd(cmd)) == []


def test_paths_in_test_cmd_are_kept_as_they_are() -> None:
    sel = select_tests(with_cmd("pytest -o addopts= tests"))
    assert sel.args == ["-o", "addopts=", "tests"] and sel.from_test_cmd
    assert selection_problems(with_cmd("pytest tests/test_a.py tests/test_b.py")) == []


def test_patch_directives_skip_data_files() -> None:
    assert patch_directives(TEST_PATCH) == ["tests/test_new.py"]


@pytest.mark.parametrize(
    "cmd,needle",
    [
        ("pytest tests/test_a.py", "not selected by test_cmd's paths"),  # test_b.py's test would never run
        ("pytest tests/test_a.py::test_x tests/test_b.py", "not selected"),
        ("pytest -x", "stops at the first failure"),
        ("pytest -xvs", "stops at the first failure"),
        ("pytest --maxfail=1", "stops after N failures"),
        ("pytest -p myplugin", "plugins are loaded by the grader only"),
        ("pytest --junitxml=out.xml", "the grader writes the report"),
        ("pytest /abs/tests", "inside the repository"),
        ("tox -e py311", "must start with `pytest`"),
    ],
)
def test_unselectable_tests_are_reported(cmd: str, needle: str) -> None:
    problems = selection_problems(with_cmd(cmd))
    assert any(needle in p for p in problems), problems


def make_repo(path: Path) -> str:
    path.mkdir(parents=True)
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "a.py").write_text("x = 1\n")
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(path), "commit", "-q", "-m", "x"], check=True, env=env)
    return subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_task_file_with_unselectable_tests_is_rejected_at_load_and_by_validate(tmp_path: Path) -> None:
    commit = make_repo(tmp_path / "repo")
    base = {
        "instance_id": "o__r-1",
        "repo": "o/r",
        "base_commit": commit,
        "problem_statement": "fix",
        "patch": "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n",
        "test_patch": "",
        "FAIL_TO_PASS": ["tests/test_a.py::test_x"],
        "PASS_TO_PASS": [],
        "repo_path": "repo",
    }
    rows = [
        dict(base, test_cmd="python -m pytest -q"),
        dict(base, instance_id="o__r-2", test_cmd="pytest tests/test_other.py"),
    ]
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TaskFileError) as info:
        load_tasks(f)
    assert len(info.value.problems) == 1 and "t.jsonl:2: field 'test_cmd':" in info.value.problems[0]
    assert "not selected by test_cmd's paths" in info.value.problems[0]
    proc = subprocess.run(
        [sys.executable, "-m", "legorl.tasks.cli", "validate", str(f)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "not selected by test_cmd's paths" in proc.stderr and "Traceback" not in proc.stderr
    f.write_text(json.dumps(rows[0]) + "\n")
    assert [t.test_cmd for t in load_tasks(f)] == ["python -m pytest -q"]


# -- the verdict --------------------------------------------------------------------------

WANTED = ["t.py::test_f2p", "t.py::test_p2p"]
CP, CF = "t.py::test_p2p_nested", "t.py::test_f2p_edge"
P, F = TestStatus.PASSED, TestStatus.FAILED


def rec(tid: str, call: str, **extra: object) -> dict:
    return {
        "k": "test",
        "id": tid,
        "phases": {"setup": "passed", "call": call, "inner": call, "teardown": "passed"},
        "function": True,
        "inner": True,
        "xfail": False,
        "runtest": False,
        **extra,
    }


def evidence(
    report: dict[str, TestStatus], records: list[dict], end: dict | None = None, **over: object
) -> RunEvidence:
    summary = {
        "records": [*records, {"k": "end", "changed": [], "foreign_hooks": [], **(end or {})}],
        "bad_records": 0,
        "junit_sha256": "s",
    }
    return RunEvidence(
        **{
            "report": report,
            "report_state": "ok",
            "summary": summary,
            "summary_tags": 1,
            "report_sha256": "s",
            "exit_code": 1,
            "timed_out": False,
            **over,
        }
    )  # type: ignore[arg-type]


HONEST = {WANTED[0]: P, WANTED[1]: P, CP: P, CF: F}
HONEST_RECORDS = [rec(WANTED[0], "passed"), rec(WANTED[1], "passed"), rec(CP, "passed"), rec(CF, "failed")]


def test_verdict_resolves_only_when_every_channel_agrees() -> None:
    v = judge(WANTED, CP, CF, evidence(HONEST, HONEST_RECORDS))
    assert v.resolved and v.flags == [] and v.tests == {WANTED[0]: "passed", WANTED[1]: "passed"}


@pytest.mark.parametrize(
    "case,flag",
    [
        ("report_better_than_raised", "report_contradicted"),
        ("no_record", "report_unconfirmed"),
        ("runner_changed", "runner_modified"),
        ("forged_record", "records_forged"),
        ("two_summaries", "summary_forged"),
        ("file_replaced", "report_replaced"),
        ("no_session_end", "session_incomplete"),
        ("canary_fail_passed", "report_inconsistent"),
        ("call_hijacked", "test_call_hijacked"),
        ("agent_plugin", "agent_hooks"),
        ("agent_import_hook", "agent_hooks"),
        ("generated_plugin", "agent_hooks"),
        ("tests_rewritten", "tests_modified_at_run"),
    ],
)
def test_verdict_flags_every_disagreement_that_favours_the_agent(case: str, flag: str) -> None:
    records = list(HONEST_RECORDS)
    report = dict(HONEST)
    end: dict = {}
    over: dict = {}
    if case == "report_better_than_raised":
        records[0] = rec(WANTED[0], "failed")
    elif case == "no_record":
        records = records[1:]
    elif case == "runner_changed":
        end = {"changed": ["_pytest.reports.TestReport.from_item_and_call"]}
    elif case == "forged_record":
        over = {"summary": {**evidence(report, records).summary, "bad_records": 3}}  # type: ignore[dict-item]
    elif case == "two_summaries":
        over = {"summary": None, "summary_tags": 2}
    elif case == "file_replaced":
        over = {"report_sha256": "other"}
    elif case == "canary_fail_passed":
        report[CF] = P
        records[3] = rec(CF, "passed")
    elif case == "call_hijacked":
        records[0] = rec(WANTED[0], "passed", inner=False)
        end = {"foreign_hooks": [{"hook": "pytest_pyfunc_call", "file": "pkg/plugin.py", "object": False}]}
    elif case == "agent_plugin":
        end = {"foreign_hooks": [{"hook": "pytest_runtest_logreport", "file": "pkg/__init__.py", "object": True}]}
    elif case == "agent_import_hook":
        end = {"import_hooks": ["Finder:pkg/__init__.py"]}
    elif case == "generated_plugin":
        end = {"foreign_hooks": [{"hook": "pytest_runtest_logreport", "file": "<generated>", "object": True}]}
    ev = evidence(report, records, end, **over)
    if case == "tests_rewritten":
        ev.summary = {**ev.summary, "tests_changed": ["t.py"]}  # type: ignore[dict-item]
    if case == "no_session_end":
        ev.summary = {**ev.summary, "records": records}  # type: ignore[dict-item]
    v = judge(WANTED, CP, CF, ev, frozenset({"pkg/__init__.py"}))
    assert not v.resolved and "tamper_attempt" in v.flags and flag in v.flags and not v.fault, (case, v)


def test_verdict_a_project_plugin_the_agent_did_not_touch_is_only_evidence() -> None:
    end = {
        "foreign_hooks": [{"hook": "pytest_runtest_logreport", "file": "pkg/testing/plugin.py", "object": False}],
        "import_hooks": ["VendoredSixImporter:pkg/_vendor/six.py"],
    }
    v = judge(WANTED, CP, CF, evidence(HONEST, HONEST_RECORDS, end), frozenset({"pkg/core.py"}))
    assert (
        v.resolved
        and v.flags == []
        and v.evidence["package_hooks"] == ["pytest_runtest_logreport:pkg/testing/plugin.py"]
    )


def test_verdict_canaries_that_never_ran_are_the_graders_fault_unless_the_agent_is_at_work() -> None:
    report = {WANTED[0]: P, WANTED[1]: P}
    records = HONEST_RECORDS[:2]
    assert judge(WANTED, CP, CF, evidence(report, records)).fault == "canaries absent"
    # the canaries' file did not collect (the agent's code broke an import): the agent's 0
    broken = judge(WANTED, CP, CF, evidence({"<collection>::t.py::t.py": TestStatus.ERROR}, []))
    assert not broken.fault and not broken.resolved
    errored = [*HONEST_RECORDS[:2], *({**r, "phases": {"setup": "failed"}} for r in HONEST_RECORDS[2:])]
    assert judge(WANTED, CP, CF, evidence({**report, CP: TestStatus.ERROR, CF: TestStatus.ERROR}, errored)).fault
    all_errored = [{**r, "phases": {"setup": "failed"}} for r in HONEST_RECORDS]
    every = judge(WANTED, CP, CF, evidence({t: TestStatus.ERROR for t in [*WANTED, CP, CF]}, all_errored))
    assert not every.fault and not every.resolved
    hooked = judge(WANTED, CP, CF, evidence(report, records, {"changed": ["_pytest.main.Session.perform_collect"]}))
    assert not hooked.fault and "runner_modified" in hooked.flags


def test_verdict_keeps_pytest_word_when_it_is_stricter_and_for_declared_xfails() -> None:
    report = {**HONEST, WANTED[1]: TestStatus.XFAILED}
    # a PASS_TO_PASS xfail counts when the file declared it at collection (the recorder says so)
    records = [*HONEST_RECORDS[:1], rec(WANTED[1], "failed", xfail=True, x={"declared": True}), *HONEST_RECORDS[2:]]
    assert judge(WANTED, CP, CF, evidence(report, records)).resolved
    undeclared = [*HONEST_RECORDS[:1], rec(WANTED[1], "failed", xfail=False), *HONEST_RECORDS[2:]]
    assert "report_contradicted" in judge(WANTED, CP, CF, evidence(report, undeclared)).flags
    # a marker only added while it ran, or one raised from the agent's code, excuses nothing
    late = [*HONEST_RECORDS[:1], rec(WANTED[1], "failed", xfail=True, x={"late_marker": True}), *HONEST_RECORDS[2:]]
    v = judge(WANTED, CP, CF, evidence(report, late))
    assert not v.resolved and "runtime_skip" in v.flags and "tamper_attempt" in v.flags
    # and a FAIL_TO_PASS test never passes by an xfail, declared or not
    f2p_x = {**HONEST, WANTED[0]: TestStatus.XFAILED}
    declared = [rec(WANTED[0], "failed", xfail=True, x={"declared": True}), *HONEST_RECORDS[1:]]
    v = judge(WANTED, CP, CF, evidence(f2p_x, declared), f2p=frozenset({WANTED[0]}))
    assert not v.resolved and v.tests[WANTED[0]] == "failed"
    stricter = {**HONEST, WANTED[0]: F}  # e.g. a strict xpass: worse than what was raised, no evidence of anything
    v = judge(WANTED, CP, CF, evidence(stricter, HONEST_RECORDS))
    assert not v.resolved and v.flags == [] and v.tests[WANTED[0]] == "failed"
