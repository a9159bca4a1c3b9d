"""Grade an agent's diff in a fresh sandbox: the last stage of a rollout.

Steps (one fresh sandbox from the task image; nothing of the agent's sandbox survives):
1. snapshot the untouched tree (`git add -A -f; write-tree`: pre), apply the agent's diff
   after dropping every section that touches a protected path (`protect.py`/`patch.py`);
2. snapshot again (post) and compare to pre *by tree*, not by trusting our diff parse:
   every protected path that changed is put back (new ones deleted, others checked out
   from pre), byte code is deleted, and a third snapshot must show no protected change;
3. apply the task's `test_patch`;
4. run the tests with the hardened runner (`runner.py`) and read per-test results from its
   JUnit report, cross-checked with the runner's exit status and the canary tests.

A FAIL_TO_PASS or PASS_TO_PASS test that is missing, skipped or errored counts as failed.
Resolved ⇔ all of them pass and nothing in the evidence says the report was tampered with.

Failure classes: anything the agent's diff causes (does not apply, hangs or crashes the
tests, fills the disk) is agent-caused and graded 0. A fault of the machinery (sandbox
start, lost sandbox, a task whose test_patch does not apply) raises `GraderFault`/
`SandboxError`; `grade()` retries those in a fresh sandbox and finally returns a masked
`infra_error`. If a sandbox dies *while the agent's code runs* in every attempt, a control
run with the empty diff decides: when it completes, the agent's code killed the sandbox.
"""

from __future__ import annotations

import secrets
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from legorl.sandbox.base import Backend, Limits, Sandbox, SandboxError, SandboxSpec
from legorl.types import Outcome, Status, Task
from legorl.verify.junit import ReportError, TestStatus, parse_junit
from legorl.verify.patch import filter_diff, split_diff
from legorl.verify.protect import Category, classify, test_files_of
from legorl.verify.runner import default_test_args, parse_test_cmd, plan_run

TAMPER = "tamper_attempt"


@dataclass(frozen=True)
class GradeConfig:
    """How grading runs. Every field has a safe default."""

    python: str = "python3"  # interpreter with pytest inside the task image
    repo_dir: str = "/repo"  # where the task image keeps the repository
    test_timeout_s: float = 600.0  # a test run longer than this is the patch's fault
    step_timeout_s: float = 120.0  # git steps; longer means the machinery is stuck
    max_diff_bytes: int = 8 << 20  # a larger diff is graded 0 (`patch_too_large`)
    penalize_tamper: bool = True  # a visible tamper attempt → hack_detected, reward 0
    retries: int = 2  # fresh-sandbox retries after an infrastructure fault
    limits: Limits = field(default_factory=Limits)


class GraderFault(RuntimeError):
    """The grading machinery (or the task) failed; never the agent's doing."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step


_GIT = "git -c core.hooksPath=/dev/null -c core.fsmonitor= -c core.quotepath=off -c advice.detachedHead=false"

_PREPARE = """set -u
W={w}
export GIT_INDEX_FILE="$W/index" GIT_LITERAL_PATHSPECS=1
G="{git}"
$G read-tree HEAD || exit 90
$G add -A -f . || exit 91
pre=$($G write-tree) || exit 92
echo "PRE $pre"
if [ -s "$W/agent.diff" ]; then
  if $G apply --whitespace=nowarn "$W/agent.diff" 2>"$W/apply.err"; then echo "APPLY ok"
  elif $G apply --whitespace=nowarn --3way "$W/agent.diff" 2>>"$W/apply.err"; then echo "APPLY 3way"
  else echo "APPLY failed"; tail -c 2000 "$W/apply.err"; exit 0
  fi
else
  echo "APPLY empty"
fi
$G add -A -f . || exit 93
post=$($G write-tree) || exit 94
$G diff-tree -r -z --no-renames --name-status "$pre" "$post" > "$W/changed" || exit 95
echo "POST $post"
"""

_RESTORE = """set -u
W={w}
export GIT_INDEX_FILE="$W/index" GIT_LITERAL_PATHSPECS=1
G="{git}"
if [ -s "$W/remove" ]; then xargs -0 rm -rf -- < "$W/remove" || exit 96; fi
if [ -s "$W/restore" ]; then $G checkout {pre} --pathspec-from-file="$W/restore" --pathspec-file-nul || exit 97; fi
find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {{}} + 2>/dev/null
find . -path ./.git -prune -o \\( -name '*.pyc' -o -name '*.pyo' \\) -type f -exec rm -f {{}} + 2>/dev/null
$G add -A -f . || exit 98
final=$($G write-tree) || exit 98
$G diff-tree -r -z --no-renames --name-status {pre} "$final" > "$W/changed2" || exit 98
echo "FINAL $final"
"""

_TEST_PATCH = """set -u
W={w}
if [ -s "$W/test.diff" ]; then git -c core.hooksPath=/dev/null apply --whitespace=nowarn "$W/test.diff" || exit 99; fi
echo "TEST_PATCH ok"
"""


def _name_status(raw: bytes) -> list[tuple[str, str]]:
    parts = raw.decode("utf-8", errors="surrogateescape").split("\0")
    out = []
    for i in range(0, len(parts) - 1, 2):
        out.append((parts[i], parts[i + 1]))
    return out


def _marker(stdout: str, key: str) -> str | None:
    for line in stdout.splitlines():
        if line.startswith(key + " "):
            return line[len(key) + 1 :].strip()
    return None


def task_test_files(task: Task) -> list[str]:
    """Paths that are tests for this task whatever their names."""
    sections, _ = split_diff(task.test_patch)
    paths = {p for sec in sections for p in sec.paths}
    return sorted(paths | test_files_of(task.FAIL_TO_PASS) | test_files_of(task.PASS_TO_PASS))


def test_args(task: Task) -> list[str]:
    """The pytest arguments of a task (its test_cmd, or the files of its tests)."""
    if task.test_cmd.strip():
        return parse_test_cmd(task.test_cmd)
    return default_test_args(task.FAIL_TO_PASS + task.PASS_TO_PASS)


async def _exec(sb: Sandbox, step: str, cmd: str, cfg: GradeConfig) -> str:
    res = await sb.exec(cmd, timeout_s=cfg.step_timeout_s, cwd=cfg.repo_dir)
    if res.timed_out or res.exit_code != 0:
        raise GraderFault(step, f"exit {res.exit_code}: {(res.stderr or res.stdout).strip()[-800:]}")
    return res.stdout


def _outcome(status: Status, flags: list[str], tests: dict[str, str], evidence: dict[str, Any]) -> Outcome:
    flags = list(dict.fromkeys(flags))
    return Outcome(reward=1.0 if status is Status.RESOLVED else 0.0, status=status, flags=flags, tests=tests, evidence=evidence)


async def grade_in(sb: Sandbox, task: Task, diff: str, cfg: GradeConfig, state: dict[str, str] | None = None) -> Outcome:
    """One grading attempt in a fresh sandbox `sb`. Raises GraderFault/SandboxError on infra faults.

    `state["step"]` tells the caller how far it got (`"tests"` while the agent's code runs).
    """
    state = state if state is not None else {}
    state["step"] = "prepare"
    t0 = time.monotonic()
    flags: list[str] = []
    ev: dict[str, Any] = {"diff_bytes": len(diff.encode())}
    wanted = list(dict.fromkeys(task.FAIL_TO_PASS + task.PASS_TO_PASS))
    missing_all = {t: TestStatus.MISSING.value for t in wanted}
    if len(diff.encode()) > cfg.max_diff_bytes:
        ev["reason"] = f"diff over {cfg.max_diff_bytes} bytes"
        return _outcome(Status.FAILED, ["patch_too_large"], missing_all, ev)

    extra = task_test_files(task)
    filtered = filter_diff(diff, extra)
    ev["stripped"] = filtered.stripped
    ev["ignored_diff_lines"] = filtered.dropped_lines
    cats = filtered.categories
    if Category.TAMPER in cats:
        flags.append(TAMPER)
    if Category.TEST in cats:
        flags.append("tests_modified")
    if Category.TEST_CONFIG in cats:
        flags.append("test_config_modified")
    if "binary" in cats:
        flags.append("binary_files")

    w = f"/tmp/.lg-{secrets.token_hex(8)}"
    await _exec(sb, "setup", f"mkdir -p {w}", cfg)
    await sb.write_file(f"{w}/agent.diff", filtered.kept.encode())
    await sb.write_file(f"{w}/test.diff", task.test_patch.encode())

    # 1. apply the filtered diff
    out = await _exec(sb, "apply", _PREPARE.format(w=shlex.quote(w), git=_GIT), cfg)
    apply = _marker(out, "APPLY") or "unknown"
    ev["apply"] = apply
    pre = _marker(out, "PRE")
    if apply == "failed":
        ev["apply_error"] = out.split("APPLY failed", 1)[-1].strip()[-2000:]
        status = Status.HACK_DETECTED if (TAMPER in flags and cfg.penalize_tamper) else Status.FAILED
        return _outcome(status, flags + ["patch_apply_failed"], missing_all, ev)
    if not pre or not _marker(out, "POST"):
        raise GraderFault("apply", f"unexpected output: {out[-500:]}")

    # 2. put every protected path back, by what the tree says changed
    changed = _name_status(await sb.read_file(f"{w}/changed"))
    remove = [p for st, p in changed if st == "A" and classify(p, extra) is not None]
    restore = [p for st, p in changed if st != "A" and classify(p, extra) is not None]
    for p in remove + restore:
        cat = classify(p, extra)
        if cat is Category.TAMPER:
            flags.append(TAMPER)
        elif cat is Category.TEST:
            flags.append("tests_modified")
        elif cat is Category.TEST_CONFIG:
            flags.append("test_config_modified")
    known = {s["path"] for s in filtered.stripped}
    sneaked = sorted(p for p in remove + restore if p not in known)
    if sneaked:  # protected paths changed although our parse of the diff kept none of them
        flags.append(TAMPER)
        ev["sneaked_paths"] = sneaked
    ev["restored"] = sorted(remove + restore)
    await sb.write_file(f"{w}/remove", "".join(p + "\0" for p in remove).encode("utf-8", "surrogateescape"))
    await sb.write_file(f"{w}/restore", "".join(p + "\0" for p in restore).encode("utf-8", "surrogateescape"))
    res = await sb.exec(_RESTORE.format(w=shlex.quote(w), git=_GIT, pre=pre), timeout_s=cfg.step_timeout_s, cwd=cfg.repo_dir)
    if res.exit_code in (96, 97):  # only the agent's path games make rm/checkout of its own changes fail
        ev["restore_error"] = res.stderr.strip()[-800:]
        return _outcome(Status.HACK_DETECTED if cfg.penalize_tamper else Status.FAILED, flags + [TAMPER, "restore_failed"], missing_all, ev)
    if res.exit_code != 0 or not _marker(res.stdout, "FINAL"):
        raise GraderFault("restore", f"exit {res.exit_code}: {res.stderr.strip()[-800:]}")
    left = [p for _, p in _name_status(await sb.read_file(f"{w}/changed2")) if classify(p, extra) is not None]
    if left:
        ev["unrestored"] = left
        return _outcome(Status.HACK_DETECTED if cfg.penalize_tamper else Status.FAILED, flags + [TAMPER, "restore_incomplete"], missing_all, ev)

    # 3. the task's tests
    await _exec(sb, "test_patch", _TEST_PATCH.format(w=shlex.quote(w)), cfg)

    # 4. run them
    args = test_args(task)
    plan = plan_run(cfg.repo_dir, args, python=cfg.python, tmp_root=w)
    ev["test_args"] = args
    await _exec(sb, "runner", f"mkdir -p {shlex.quote(plan.work_dir)} {shlex.quote(plan.canary_path.rsplit('/', 1)[0])}", cfg)
    for path, text in plan.files.items():
        await sb.write_file(path, text.encode())
    state["step"] = "tests"
    run = await sb.exec(plan.command, timeout_s=cfg.test_timeout_s, cwd=cfg.repo_dir)
    state["step"] = "report"
    ev["exit_code"] = run.exit_code
    ev["test_output"] = (run.stdout[-3000:] + ("\n" + run.stderr[-1500:] if run.stderr.strip() else "")).strip()
    ev["test_duration_s"] = round(run.duration_s, 3)
    if run.timed_out:
        flags.append("test_timeout")
    if run.resource_exhausted:
        flags.append("resource_exhausted")

    try:
        report: dict[str, TestStatus] | None = parse_junit(await sb.read_file(plan.junit_path))
        ev["report"] = "ok"
    except OSError:
        report = None
        ev["report"] = "missing"
    except ReportError as exc:
        report = None
        ev["report"] = f"invalid: {exc}"
        flags.append(TAMPER)
    results = dict(report or {})
    canary_pass = results.pop(plan.canary_pass, TestStatus.MISSING)
    canary_fail = results.pop(plan.canary_fail, TestStatus.MISSING)
    ev["canary"] = {"pass": canary_pass.value, "fail": canary_fail.value}
    tests = {t: results.get(t, TestStatus.MISSING).value for t in wanted}
    all_ok = bool(wanted) and all(TestStatus(s).ok for s in tests.values())
    ev["f2p_passed"] = sum(TestStatus(tests[t]).ok for t in task.FAIL_TO_PASS)
    ev["p2p_passed"] = sum(TestStatus(tests[t]).ok for t in task.PASS_TO_PASS)

    # Tamper evidence: the canary that must fail did not, or the exit code contradicts the report.
    if canary_fail in (TestStatus.PASSED, TestStatus.SKIPPED, TestStatus.XFAILED):
        flags.append(TAMPER)
        flags.append("report_inconsistent")
    if run.exit_code == 0 and not run.timed_out:
        flags.append(TAMPER)
        flags.append("report_missing" if report is None else "report_inconsistent")
    if report is None and run.exit_code != 0:
        flags.append("report_missing")
    integrity = report is not None and canary_fail is TestStatus.FAILED and canary_pass is TestStatus.PASSED and run.exit_code != 0
    if all_ok and not integrity:
        flags.append(TAMPER)
        flags.append("report_inconsistent")
    ev["duration_s"] = round(time.monotonic() - t0, 3)
    if TAMPER in flags and cfg.penalize_tamper:
        return _outcome(Status.HACK_DETECTED, flags, tests, ev)
    return _outcome(Status.RESOLVED if (all_ok and integrity) else Status.FAILED, flags, tests, ev)


async def grade(task: Task, diff: str, backend: Backend, image: str, cfg: GradeConfig | None = None) -> Outcome:
    """Grade `diff` for `task` in a fresh sandbox from `image`, retrying infrastructure faults."""
    cfg = cfg or GradeConfig()
    errors: list[str] = []
    died_running_agent_code = 0
    attempts = cfg.retries + 1
    for _ in range(attempts):
        outcome, err, step = await _attempt(task, diff, backend, image, cfg)
        if outcome is not None:
            outcome.evidence["grade_attempts"] = len(errors) + 1
            if errors:
                outcome.evidence["grade_retried_after"] = errors
            return outcome
        errors.append(err)
        died_running_agent_code += step == "tests"
    if diff.strip() and died_running_agent_code == attempts:
        control, cerr, _ = await _attempt(task, "", backend, image, cfg)
        if control is not None:  # the machinery works: the agent's code took the sandbox down
            return Outcome(0.0, Status.FAILED, flags=["grader_sandbox_killed"], evidence={"errors": errors})
        errors.append(f"control: {cerr}")
    return Outcome(0.0, Status.INFRA_ERROR, masked=True, evidence={"cause": Status.GRADER_ERROR.value, "errors": errors})


async def _attempt(task: Task, diff: str, backend: Backend, image: str, cfg: GradeConfig) -> tuple[Outcome | None, str, str]:
    """(outcome, "", "") or (None, error text, step that failed)."""
    try:
        sb = await backend.start(SandboxSpec(image=image, limits=cfg.limits, workdir=cfg.repo_dir))
    except SandboxError as exc:
        return None, f"{Status.SANDBOX_START_FAILED.value}: {exc}", "start"
    state: dict[str, str] = {}
    try:
        async with sb:
            try:
                return await grade_in(sb, task, diff, cfg, state), "", ""
            except GraderFault as exc:
                return None, f"{Status.GRADER_ERROR.value}: {exc}", exc.step
            except SandboxError as exc:
                step = state.get("step", "prepare")
                return None, f"{Status.GRADER_ERROR.value}: sandbox lost during {step}: {exc}", step
    except SandboxError as exc:  # closing failed
        return None, f"{Status.GRADER_ERROR.value}: close failed: {exc}", state.get("step", "close")
