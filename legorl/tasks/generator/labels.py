"""Run a project's tests on the host with the same hardened invocation the grader uses.

Generation runs thousands of test runs, so it uses a host interpreter (one whose pytest
matches the base image's) instead of a sandbox; every task it writes is then checked in
real sandboxes by the oracle validation (`legorl tasks validate`), which is the authority.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from legorl.verify.junit import ReportError, TestStatus, failure_texts, parse_junit
from legorl.verify.pytest_plan import plan_run


@dataclass
class TestRun:
    __test__ = False

    exit_code: int
    results: dict[str, TestStatus]  # canaries removed
    failures: dict[str, str]  # node id -> failure text
    output: str


def run_tests(repo: Path, args: list[str], python: str, timeout_s: float = 300.0) -> TestRun:
    """Run `pytest ARGS` in `repo` hardened; a missing or bad report raises RuntimeError."""
    plan = plan_run(str(repo), args, python=python)
    os.makedirs(plan.work_dir, exist_ok=True)
    try:
        for path, text in plan.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        proc = subprocess.Popen(
            plan.command, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the whole process group, not just the shell
            proc.communicate()
            return TestRun(exit_code=124, results={}, failures={}, output="timeout")
        output = stdout[-20000:] + stderr[-5000:]
        try:
            data = Path(plan.junit_path).read_bytes()
            results = parse_junit(data)
            failures = failure_texts(data)
        except (OSError, ReportError):
            return TestRun(exit_code=proc.returncode, results={}, failures={}, output=output)
        for canary in (plan.canary_pass, plan.canary_fail):
            results.pop(canary, None)
            failures.pop(canary, None)
        return TestRun(exit_code=proc.returncode, results=results, failures=failures, output=output)
    finally:
        shutil.rmtree(plan.work_dir, ignore_errors=True)
        shutil.rmtree(Path(plan.canary_path).parent, ignore_errors=True)
