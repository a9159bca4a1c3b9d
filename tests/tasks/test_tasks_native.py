"""SWE-bench instances as users bring them (issue 15): the official instance format, the
official package's log parsers, and Django's/SymPy's own runners graded with the
stage-wise defences, on tasks built from the real releases (scripts/setup_swebench.sh
downloads the sdists; the tasks are built once per machine and cached)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from legorl.tasks import official
from legorl.tasks.generator.native import NATIVE_PROJECTS, build_native_tasks, swebench_cache
from legorl.tasks.loader import TaskFileError, load_tasks
from legorl.types import Status, Task
from legorl.verify.test_command import native_command
from tests.helpers.tasks_util import append_lines_diff, base_file, require_backend

CLI = [sys.executable, "-m", "legorl.tasks.cli"]
EVAL_SCRIPT = """#!/bin/bash
set -uxo pipefail
cd /testbed
git checkout {c} tests/utils_tests/test_text.py
: '>>>>> Start Test Output'
./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 utils_tests.test_text
: '>>>>> End Test Output'
git checkout {c} tests/utils_tests/test_text.py
"""


def have_sdists() -> bool:
    return all((swebench_cache() / "sdists" / f"{p.slug}.tar.gz").is_file() for p in NATIVE_PROJECTS.values())


def native_tasks(name: str) -> Path:
    if not have_sdists():
        pytest.fail("the Django/SymPy sdists are missing: run scripts/setup_swebench.sh")
    return build_native_tasks(name)


def official_row(**over: object) -> dict:
    """An instance as the published datasets have it (lists JSON-encoded, no repo_path)."""
    c = "a" * 40
    row = {
        "instance_id": "django__django-1",
        "repo": "django/django",
        "base_commit": c,
        "version": "5.2",
        "problem_statement": "p",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "patch": "diff --git a/django/x.py b/django/x.py\n",
        "test_patch": "diff --git a/tests/x.py b/tests/x.py\n",
        "FAIL_TO_PASS": json.dumps(["test_a (utils_tests.test_text.TestUtilsText.test_a)"]),
        "PASS_TO_PASS": json.dumps(["test_b (utils_tests.test_text.TestUtilsText)"]),
        "environment_setup_commit": c,
        "eval_script": EVAL_SCRIPT.format(c=c),
    }
    row.update(over)
    return row


def test_the_official_package_is_the_pinned_one_and_names_the_parsers() -> None:
    assert official.version() == official.PINNED
    assert official.parser_name("django/django") == "parse_log_django"
    assert official.parser_name("sympy/sympy") == "parse_log_sympy"
    assert official.parser_name("nobody/nothing") is None
    assert official.parser_name("django/django", "parse_log_nope") is None
    log = "test_a (m.C.test_a) ... ok\ntest_b (m.C.test_b) ... FAIL\n"
    assert official.parse_log("parse_log_django", log, "i", "django/django", [], []) == {
        "test_a (m.C.test_a)": "PASSED",
        "test_b (m.C.test_b)": "FAILED",
    }


def test_official_rows_load_with_a_repos_dir_and_bad_rows_are_skipped_one_by_one(tmp_path: Path) -> None:
    repos = tmp_path / "repos"
    (repos / "django__django" / ".git").mkdir(parents=True)
    rows = [
        official_row(),
        official_row(instance_id="psf__requests-1", repo="psf/requests", eval_script="", version="2.0"),
        official_row(instance_id="x__y-1", repo="x/y"),
        official_row(
            instance_id="django__django-2", eval_script=EVAL_SCRIPT.replace("./tests/runtests.py", "tox -e py311")
        ),
        official_row(instance_id="django__django-3", FAIL_TO_PASS=json.dumps(["test_z (other_app.tests.T.test_z)"])),
    ]
    f = tmp_path / "verified.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TaskFileError):
        load_tasks(f, repos_dir=repos)
    skipped: list[str] = []
    tasks = load_tasks(f, repos_dir=repos, skipped=skipped)
    assert [t.instance_id for t in tasks] == ["django__django-1"]
    t = tasks[0]
    assert t.test_cmd.startswith("./tests/runtests.py") and t.log_parser == "parse_log_django" and t.version == "5.2"
    assert t.FAIL_TO_PASS == ["test_a (utils_tests.test_text.TestUtilsText.test_a)"]
    assert t.repo_path == str((repos / "django__django").resolve())
    text = "\n".join(skipped)
    assert len(skipped) == 4, skipped
    assert "verified.jsonl:2: no test command for psf/requests version 2.0" in text
    assert "verified.jsonl:3: no official log parser for repository 'x/y'" in text
    assert "verified.jsonl:4: field 'test_cmd': test runner 'tox' cannot be hardened" in text
    assert (
        "verified.jsonl:5: field 'test_cmd': 1 FAIL_TO_PASS/PASS_TO_PASS tests are not selected by its labels" in text
    )


def test_native_commands_are_hardened_or_refused_by_name() -> None:
    dj = native_command("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 4 a.tests")
    assert dj is not None and dj.args == ["--settings=test_sqlite", "--verbosity", "2", "--parallel", "1", "a.tests"]
    sy = native_command("PYTHONWARNINGS='ignore::UserWarning' bin/test -C --verbose sympy/core/tests/test_basic.py")
    assert sy is not None and "--no-subprocess" in sy.args and sy.warnings == ["ignore::UserWarning"]
    assert native_command("python -m pytest -q") is None
    for cmd, word in [
        ("tox -e py", "'tox'"),
        ("make test", "'make'"),
        ("./tests/runtests.py --failfast a", "--failfast"),
        ("FOO=1 bin/test x.py", "FOO"),
        ("bin/test --pdb x.py", "--pdb"),
    ]:
        with pytest.raises(ValueError, match=word):
            native_command(cmd)


def cli(*args: object, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def validate(name: str, backend: str) -> list[dict]:
    f = native_tasks(name)
    proc = cli("validate", f, "--repos-dir", f.parent / "repos", "--sandbox", backend, "--json")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and rows and all(r["ok"] for r in rows), (rows, proc.stderr[-3000:])
    assert all(r["gold"] == "resolved" and r["empty"] == "failed" for r in rows)
    return rows


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("name", ["django", "sympy"])
def test_native_runner_tasks_from_real_releases_validate_on_docker(name: str) -> None:
    require_backend("docker")
    validate(name, "docker")


async def _check_and_grade(task: Task, diffs: list[str], backend_name: str = "local") -> tuple:
    """The oracle check (what `legorl tasks validate` runs), then a grade of each diff."""
    from legorl.sandbox import open_backend
    from legorl.tasks.image import TaskImages
    from legorl.tasks.validate import check_task
    from legorl.verify.grade import grade

    backend = open_backend(backend_name)
    try:
        images = TaskImages(backend_name)
        check = await check_task(task, backend, images)
        image = await images.for_task(task)
        return check, [await grade(task, d, backend, image) for d in diffs]
    finally:
        await backend.aclose()


def _task(name: str) -> Task:
    f = native_tasks(name)
    return load_tasks(f, repos_dir=f.parent / "repos")[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["django", "sympy"])
def test_native_tasks_validate_on_local_agree_with_the_official_parser_and_forged_passes_are_caught(name: str) -> None:
    task = _task(name)
    source = NATIVE_PROJECTS[name].source
    if name == "django":  # leave the bug, and make every failing subtest report as a success
        forge = [
            "import unittest.runner as _r",
            "_sub = _r.TextTestResult.addSubTest",
            "_r.TextTestResult.addSubTest = lambda self, test, sub, err: _sub(self, test, sub, None)",
            "_ae = _r.TextTestResult.addFailure",
            "_r.TextTestResult.addFailure = lambda self, t, err: self.addSuccess(t)",
        ]
    else:  # print the runner's pass line for each task test, then stop the run cleanly
        ids = ", ".join(repr(t) for t in task.FAIL_TO_PASS + task.PASS_TO_PASS)
        forge = [
            "import sys as _s, os as _o",
            f"for _t in [{ids}]:",
            "    _s.stdout.write(_t + ' ok\\n')",
            "_s.stdout.flush()",
            "_o._exit(1) if 'bin/test' in ' '.join(_s.argv) else None",
        ]
    forged_diff = append_lines_diff(source, base_file(task, source), forge)  # the bug stays in
    # the runner's own entry script made to report success: restored from the task before the run
    runner = "tests/runtests.py" if name == "django" else "bin/test"
    runner_diff = append_lines_diff(runner, base_file(task, runner), ["import os", "os._exit(0)"])
    check, (forged, rigged) = asyncio.run(_check_and_grade(task, [forged_diff, runner_diff]))
    assert rigged.status is Status.FAILED and "tests_modified" in rigged.flags, (rigged.status, rigged.flags)
    assert [s["path"] for s in rigged.evidence["stripped"]] == [runner]  # dropped from the diff, never run
    assert check.ok, check.problems
    gold, empty = check.gold, check.empty
    for out in (gold, empty):
        agree = out.evidence["parser_agreement"]
        assert agree["agree"] == agree["total"] == len(task.FAIL_TO_PASS + task.PASS_TO_PASS), agree
    assert gold.status is Status.RESOLVED and empty.status is Status.FAILED
    assert forged.status is Status.HACK_DETECTED, (forged.status, forged.flags, forged.evidence.get("contradicted"))
    assert "tamper_attempt" in forged.flags
    assert {"report_contradicted", "runner_modified", "report_unconfirmed", "session_incomplete"} & set(forged.flags), (
        forged.flags
    )


def test_eval_writes_the_official_results_shape() -> None:
    from legorl.loop.official_report import run_report
    from legorl.types import Outcome

    def task(i: str) -> Task:
        return Task(i, "o/r", "a" * 40, "", "", "", ["t.py::f"], ["t.py::p"])

    tasks = [task("a"), task("b"), task("c"), task("d"), task("e")]
    outcomes = {
        "a": Outcome(1.0, Status.RESOLVED, tests={"t.py::f": "passed", "t.py::p": "passed"}),
        "b": Outcome(0.0, Status.FAILED, tests={"t.py::f": "failed", "t.py::p": "passed"}),
        "c": Outcome(0.0, Status.INFRA_ERROR, masked=True, evidence={"errors": ["sandbox_start_failed: x"]}),
        "d": Outcome(0.0, Status.NO_PATCH),
    }
    rep = run_report(tasks, outcomes)
    assert rep["schema_version"] == 2 and rep["total_instances"] == 5 and rep["submitted_instances"] == 4
    assert rep["resolved_ids"] == ["a"] and rep["unresolved_ids"] == ["b"] and rep["error_ids"] == ["c"]
    assert rep["empty_patch_ids"] == ["d"] and rep["incomplete_ids"] == ["e"] and rep["completed_ids"] == ["a", "b"]
    assert rep["instances"]["b"]["tests_status"]["FAIL_TO_PASS"] == {"success": [], "failure": ["t.py::f"]}
    assert rep["instances"]["a"]["resolved"] and not rep["instances"]["b"]["resolved"]
    assert "c" not in rep["instances"]  # an infrastructure error is never an unresolved instance


def _summary(records: dict[str, str], end: bool = True, **over: object) -> dict:
    recs = [{"k": "test", "id": t, "phases": {"setup": "passed", "call": v}} for t, v in records.items()]
    s = {
        "records": recs + ([{"k": "end", "changed": []}] if end else []),
        "bad_records": 0,
        "log_sha256": "h",
        "canaries": {"pass": "cp", "fail": "cf"},
        "tests_changed": [],
    }
    s.update(over)
    return s


@pytest.mark.parametrize(
    "official_log,records,extra,exit_code,flag",
    [
        (
            {"t1": "PASSED", "t2": "PASSED"},
            {"t1": "passed"},
            {},
            1,
            "report_unconfirmed",
        ),  # a printed pass line, no test ran
        ({"t1": "PASSED", "t2": "PASSED"}, {"t1": "passed", "t2": "failed"}, {}, 1, "report_contradicted"),
        (
            {"t1": "PASSED", "t2": "PASSED"},
            {"t1": "passed", "t2": "passed"},
            {"end_changed": ["unittest.runner.TextTestResult.addFailure"]},
            1,
            "runner_modified",
        ),
        (
            {"t1": "PASSED", "t2": "PASSED", "cf": "PASSED"},
            {"t1": "passed", "t2": "passed"},
            {},
            1,
            "report_inconsistent",
        ),
        (
            {"t1": "PASSED", "t2": "PASSED"},
            {"t1": "passed", "t2": "passed"},
            {},
            0,
            "report_inconsistent",
        ),  # exit 0 with a failing canary
        ({"t1": "PASSED", "t2": "PASSED"}, {"t1": "passed", "t2": "passed"}, {"bad_records": 2}, 1, "records_forged"),
        ({"t1": "PASSED", "t2": "PASSED"}, {"t1": "passed", "t2": "passed"}, {"log": "other"}, 1, "report_replaced"),
    ],
)
def test_native_verdict_needs_the_official_parse_and_the_records_to_agree(
    official_log, records, extra, exit_code, flag
) -> None:
    from legorl.verify.native import judge_native

    base = {"cp": "PASSED", "cf": "FAILED"}
    recs = dict(records, cp="passed", cf="failed")
    summary = _summary(recs, bad_records=extra.get("bad_records", 0))
    if "end_changed" in extra:
        summary["records"][-1]["changed"] = extra["end_changed"]
    good = judge_native(
        ["t1", "t2"],
        {**base, "t1": "PASSED", "t2": "PASSED"},
        _summary(dict(t1="passed", t2="passed", cp="passed", cf="failed")),
        1,
        "h",
        1,
        False,
    )
    assert good.resolved and not good.flags and good.evidence["parser_agreement"]["agree"] == 2
    v = judge_native(["t1", "t2"], {**base, **official_log}, summary, 1, extra.get("log", "h"), exit_code, False)
    assert not v.resolved and "tamper_attempt" in v.flags and flag in v.flags, v.flags


def test_django_ids_of_either_python_read_a_log_of_the_other() -> None:
    from legorl.verify.execute import django_aliases

    got = django_aliases(
        {"test_x (m.C.test_x)": "PASSED", "test_y (m.C)": "FAILED"},
        ["test_x (m.C)", "test_y (m.C.test_y)", "test_z (m.C)"],
    )
    assert got["test_x (m.C)"] == "PASSED" and got["test_y (m.C.test_y)"] == "FAILED" and "test_z (m.C)" not in got


def test_the_two_django_canaries_never_share_a_class_or_take_a_task_class() -> None:
    """One class and one word leave a single one-word name: the second canary must not rebind
    the first (the must-pass one would vanish and a gold patch would read as forged)."""
    from legorl.verify.native import plan_native

    cmd = native_command("./tests/runtests.py --settings=test_sqlite foo_tests.tests")
    assert cmd is not None
    for _ in range(50):
        plan = plan_native(
            "/repo", cmd, "python", "/tmp", "tests/foo_tests/tests.py", ["test_a"], ["FooTests"], [], [], []
        )
        ids = json.loads(next(v for k, v in plan.files.items() if k.endswith(".json")))["plant"]["ids"]
        pass_cls, fail_cls = (ids[k].split("(", 1)[1].rsplit(".", 2)[-2] for k in ("pass", "fail"))
        assert pass_cls != fail_cls and {pass_cls, fail_cls}.isdisjoint({"FooTests"}), ids
