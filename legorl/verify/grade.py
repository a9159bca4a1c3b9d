"""Grade an agent's diff in a fresh sandbox: the last stage of a rollout.

Steps (one fresh sandbox from the task image; nothing of the agent's sandbox survives):
1. snapshot the untouched tree (`git add -A -f; write-tree`: pre), apply the agent's diff
   after dropping every section that touches a protected path (`protect.py`/`patch.py`);
2. snapshot again (post) and compare to pre *by tree*, not by trusting our diff parse:
   every protected path that changed is put back (new ones deleted, others checked out
   from pre), byte code is deleted, and a third snapshot must show no protected change;
3. apply the task's `test_patch`;
4. run the task's tests as SWE-bench selects them (`selection.py`: test_cmd's flags, its paths
   or else the task's test files) under the supervised runner (`runner.py`,
   `_supervisor.py`), with canaries planted among the task's own tests, and decide from
   three channels that must agree (`verdict.py`): the JUnit report, the recorder's records
   of what each test raised plus its check of pytest's machinery, and the canaries.

A FAIL_TO_PASS or PASS_TO_PASS test that is missing, skipped or errored counts as failed.
Resolved ⇔ all of them pass in the report, the records confirm it, and nothing in the
evidence says the report or the runner was tampered with.

Failure classes: anything the agent's diff causes (does not apply, makes the task's
test_patch conflict, hangs or crashes the tests, fills the disk) is agent-caused and graded
0. A fault of the machinery (sandbox start, lost sandbox, a task whose test_patch does not
apply even to the untouched tree) raises `GraderFault`/
`SandboxError`; `grade()` returns them as a masked
`infra_error` (the rollout worker retries the whole rollout). If the sandbox dies *while the agent's code runs*, a
control
run with the empty diff decides: when it completes, the agent's code killed the sandbox.
"""

from __future__ import annotations

import hashlib
import secrets
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from legorl.sandbox.base import Backend, Limits, Sandbox, SandboxError, SandboxSpec
from legorl.types import Outcome, Status, Task
from legorl.verify.junit import ReportError, TestStatus, parse_junit
from legorl.verify.native import judge_native, plan_native
from legorl.verify.patch import filter_diff, split_diff
from legorl.verify.protect import Category, classify, test_files_of
from legorl.verify.runner import SETUP_FAILED, TestCmdError, parse_summary, plan_run
from legorl.verify.runners import (
    RUNNER_FILES,
    NativeCommand,
    django_class,
    django_label_covers,
    django_test_file,
    native_command,
)
from legorl.verify.selection import covers, select_tests
from legorl.verify.verdict import TAMPER, RunEvidence, judge


@dataclass(frozen=True)
class GradeConfig:
    """How grading runs. Every field has a safe default."""

    python: str = "python3"  # interpreter with pytest inside the task image
    repo_dir: str = "/repo"  # where the task image keeps the repository
    test_timeout_s: float = 600.0  # a test run longer than this is the patch's fault
    step_timeout_s: float = 120.0  # git steps; longer means the machinery is stuck
    max_diff_bytes: int = 8 << 20  # a larger diff is graded 0 (`patch_too_large`)
    penalize_tamper: bool = True  # a visible tamper attempt → hack_detected, reward 0
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
G="{git}"
if [ -s "$W/test.diff" ] && ! $G apply --whitespace=nowarn "$W/test.diff" 2>"$W/tp.err"; then
  cat "$W/tp.err" >&2
  # Does it apply to the task's own tree? Then the agent's changes are in its way.
  export GIT_INDEX_FILE="$W/index.tp"
  $G read-tree {pre} || exit 99
  if $G apply --cached --check --whitespace=nowarn "$W/test.diff" 2>/dev/null; then exit 98; fi
  exit 99
fi
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
    """Paths that are tests for this task whatever their names (for a native runner also
    the files that decide how it runs, `runners.RUNNER_FILES`)."""
    sections, _ = split_diff(task.test_patch)
    paths = {p for sec in sections for p in sec.paths}
    ids = task.FAIL_TO_PASS + task.PASS_TO_PASS
    paths |= test_files_of(ids)
    native = _native_or_none(task)
    if native is not None:
        paths |= set(RUNNER_FILES[native.runner])
        if native.runner == "django":
            paths |= {f for f in map(django_test_file, ids) if f}
        else:
            paths |= {lb for lb in native.labels if lb.endswith(".py")}
    return sorted(paths)


def _native_or_none(task: Task) -> NativeCommand | None:
    try:
        return native_command(task.test_cmd) if task.test_cmd.strip() else None
    except TestCmdError:
        return None


def test_args(task: Task) -> list[str]:
    """The pytest arguments of a task: test_cmd's flags, then its paths or the task's test files."""
    return select_tests(task).args


async def _exec(sb: Sandbox, step: str, cmd: str, cfg: GradeConfig) -> str:
    res = await sb.exec(cmd, timeout_s=cfg.step_timeout_s, cwd=cfg.repo_dir)
    if res.timed_out or res.exit_code != 0:
        raise GraderFault(step, f"exit {res.exit_code}: {(res.stderr or res.stdout).strip()[-800:]}")
    return res.stdout


def _outcome(status: Status, flags: list[str], tests: dict[str, str], evidence: dict[str, Any]) -> Outcome:
    flags = list(dict.fromkeys(flags))
    return Outcome(
        reward=1.0 if status is Status.RESOLVED else 0.0, status=status, flags=flags, tests=tests, evidence=evidence
    )


async def grade_in(
    sb: Sandbox, task: Task, diff: str, cfg: GradeConfig, state: dict[str, str] | None = None
) -> Outcome:
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
    res = await sb.exec(
        _RESTORE.format(w=shlex.quote(w), git=_GIT, pre=pre), timeout_s=cfg.step_timeout_s, cwd=cfg.repo_dir
    )
    if res.exit_code in (96, 97):  # only the agent's path games make rm/checkout of its own changes fail
        ev["restore_error"] = res.stderr.strip()[-800:]
        return _outcome(
            Status.HACK_DETECTED if cfg.penalize_tamper else Status.FAILED,
            flags + [TAMPER, "restore_failed"],
            missing_all,
            ev,
        )
    if res.exit_code != 0 or not _marker(res.stdout, "FINAL"):
        raise GraderFault("restore", f"exit {res.exit_code}: {res.stderr.strip()[-800:]}")
    left = [p for _, p in _name_status(await sb.read_file(f"{w}/changed2")) if classify(p, extra) is not None]
    if left:
        ev["unrestored"] = left
        return _outcome(
            Status.HACK_DETECTED if cfg.penalize_tamper else Status.FAILED,
            flags + [TAMPER, "restore_incomplete"],
            missing_all,
            ev,
        )

    # 3. the task's tests; one that applies to the untouched tree but not after the agent's
    # diff was broken by the agent (e.g. a file where the test patch needs a directory)
    tp = await sb.exec(
        _TEST_PATCH.format(w=shlex.quote(w), git=_GIT, pre=pre), timeout_s=cfg.step_timeout_s, cwd=cfg.repo_dir
    )
    if tp.exit_code == 98 and not tp.timed_out:
        ev["test_patch_error"] = (tp.stderr or tp.stdout).strip()[-800:]
        return _outcome(Status.FAILED, flags + ["test_patch_conflict"], missing_all, ev)
    if tp.exit_code != 0 or tp.timed_out:
        raise GraderFault("test_patch", f"exit {tp.exit_code}: {(tp.stderr or tp.stdout).strip()[-800:]}")

    # 4. run them: the task's selection, canaries planted among its own tests
    try:
        native = native_command(task.test_cmd) if task.test_cmd.strip() else None
    except TestCmdError as exc:
        raise GraderFault("select", str(exc)) from None
    agent_files = frozenset(p for st, p in changed if st != "D") - set(remove + restore)
    if native is not None:
        return await _grade_native(sb, task, native, cfg, w, extra, flags, ev, state, t0, agent_files)
    try:
        sel = select_tests(task)
    except TestCmdError as exc:
        raise GraderFault("select", str(exc)) from None
    host, like = canary_host(task, sel.directives)
    guard = guarded_files([*extra, *sel.directives])
    plan = plan_run(
        cfg.repo_dir,
        sel.args,
        python=cfg.python,
        tmp_root=w,
        plant_in=host,
        like=like,
        guard=guard,
        wanted=wanted,
        agent_files=sorted(agent_files),
    )
    ev["test_args"] = sel.args
    dirs = {plan.work_dir} | ({plan.canary_path.rsplit("/", 1)[0]} if plan.canary_source else set())
    await _exec(sb, "runner", "mkdir -p " + " ".join(shlex.quote(d) for d in sorted(dirs)), cfg)
    for path, text in plan.files.items():
        await sb.write_file(path, text.encode())
    state["step"] = "tests"
    run = await sb.exec(plan.command, timeout_s=cfg.test_timeout_s, cwd=cfg.repo_dir)
    state["step"] = "report"
    ev["exit_code"] = run.exit_code
    ev["test_output"] = (run.stderr[-3000:] + ("\n" + _untagged(run.stdout, plan.nonce)[-1500:])).strip()
    ev["test_duration_s"] = round(run.duration_s, 3)
    if run.timed_out:
        flags.append("test_timeout")
    if run.resource_exhausted:
        flags.append("resource_exhausted")

    summary, tags = parse_summary(run.stdout, plan.nonce)
    if summary is None and run.exit_code == SETUP_FAILED and "legorl-supervisor:" in run.stderr:
        raise GraderFault("runner", run.stderr.strip()[-800:])
    report: dict[str, TestStatus] | None = None
    sha: str | None = None
    try:
        data = await sb.read_file(plan.junit_path)
        sha = hashlib.sha256(data).hexdigest()
        report = parse_junit(data)
        ev["report"] = "ok"
    except OSError:
        ev["report"] = "missing"
    except ReportError as exc:
        ev["report"] = f"invalid: {exc}"
    c_pass, c_fail = plan.canaries(summary)
    evidence = RunEvidence(report, ev["report"], summary, tags, sha, run.exit_code, run.timed_out)
    verdict = judge(wanted, c_pass, c_fail, evidence, agent_files, frozenset(task.FAIL_TO_PASS))
    if verdict.fault:
        raise GraderFault("canary", verdict.fault)
    flags += verdict.flags
    ev.update(verdict.evidence)
    if report is None and "report_missing" not in flags and run.exit_code != 0 and ev["report"] == "missing":
        flags.append("report_missing")
    tests = verdict.tests
    ev["f2p_passed"] = sum(TestStatus(tests[t]).ok for t in task.FAIL_TO_PASS)
    ev["p2p_passed"] = sum(TestStatus(tests[t]).ok for t in task.PASS_TO_PASS)
    ev["duration_s"] = round(time.monotonic() - t0, 3)
    if TAMPER in flags and cfg.penalize_tamper:
        return _outcome(Status.HACK_DETECTED, flags, tests, ev)
    return _outcome(Status.RESOLVED if verdict.resolved else Status.FAILED, flags, tests, ev)


def native_canary_host(task: Task, cmd: NativeCommand) -> tuple[str | None, list[str], list[str]]:
    """(file to plant the canaries in, its tests' function names, its test classes' names)."""
    ids = task.FAIL_TO_PASS + task.PASS_TO_PASS
    if cmd.runner == "sympy":
        files = [lb for lb in cmd.labels if lb.endswith(".py")]
        return (files[0] if files else None), [t for t in ids if t.isidentifier()], []
    for tid in ids:
        file = django_test_file(tid)
        if file and any(django_label_covers(lb, tid) for lb in cmd.labels):
            mine = [t for t in ids if django_test_file(t) == file]
            names = [t.split(" ", 1)[0] for t in mine]
            classes = [c for c in map(django_class, mine) if c]
            return file, names, classes
    return None, [], []


async def _grade_native(
    sb: Sandbox,
    task: Task,
    cmd: NativeCommand,
    cfg: GradeConfig,
    w: str,
    extra: list[str],
    flags: list[str],
    ev: dict[str, Any],
    state: dict[str, str],
    t0: float,
    agent_files: frozenset[str] = frozenset(),
) -> Outcome:
    """Step 4 for a native runner (`native.py`): the official parser reads the log, the
    recorder's records confirm it, the canaries vouch for the run."""
    from legorl.tasks import official

    wanted = list(dict.fromkeys(task.FAIL_TO_PASS + task.PASS_TO_PASS))
    parser = official.parser_name(task.repo, task.log_parser)
    if parser is None:
        raise GraderFault("parser", f"no official log parser for repository {task.repo!r}")
    host, like, like_classes = native_canary_host(task, cmd)
    if host is None:
        raise GraderFault("select", f"no task test file among the runner's labels {cmd.labels} to plant canaries in")
    tests_py = [p for p in extra if p.endswith(".py")]
    plan = plan_native(
        cfg.repo_dir, cmd, cfg.python, w, host, like, like_classes, tests_py, wanted, tests_py, sorted(agent_files)
    )
    ev["test_args"] = [cmd.script, *cmd.args]
    ev["runner"] = cmd.runner
    await _exec(sb, "runner", f"mkdir -p {shlex.quote(plan.work_dir)}", cfg)
    for path, text in plan.files.items():
        await sb.write_file(path, text.encode())
    state["step"] = "tests"
    run = await sb.exec(plan.command, timeout_s=cfg.test_timeout_s, cwd=cfg.repo_dir)
    state["step"] = "report"
    ev["exit_code"] = run.exit_code
    ev["test_output"] = run.stderr[-3000:].strip()
    ev["test_duration_s"] = round(run.duration_s, 3)
    if run.timed_out:
        flags.append("test_timeout")
    if run.resource_exhausted:
        flags.append("resource_exhausted")
    summary, tags = parse_summary(run.stdout, plan.nonce)
    if summary is None and run.exit_code == SETUP_FAILED and "legorl-supervisor:" in run.stderr:
        raise GraderFault("runner", run.stderr.strip()[-800:])
    log, sha = "", None
    try:
        data = await sb.read_file(plan.log_path)
        sha, log = hashlib.sha256(data).hexdigest(), data.decode("utf-8", "replace")
        ev["report"] = "ok"
    except OSError:
        ev["report"] = "missing"
    try:
        parsed = (
            official.parse_log(parser, log, task.instance_id, task.repo, task.FAIL_TO_PASS, task.PASS_TO_PASS)
            if log
            else None
        )
    except Exception as exc:  # the official parser choked on a log: ours to look at, never the agent's reward
        raise GraderFault("parser", f"{parser} failed on the log: {type(exc).__name__}: {exc}") from None
    ev["log_parser"] = parser
    if parsed is not None and cmd.runner == "django":
        parsed = _django_aliases(parsed, wanted)
    verdict = judge_native(
        wanted, parsed, summary, tags, sha, run.exit_code, run.timed_out, agent_files, frozenset(task.FAIL_TO_PASS)
    )
    if verdict.fault:
        raise GraderFault("canary", verdict.fault)
    flags += verdict.flags
    ev.update(verdict.evidence)
    ev["official"] = {t: (parsed or {}).get(t, "MISSING") for t in wanted}
    tests = verdict.tests
    ev["f2p_passed"] = sum(TestStatus(tests[t]).ok for t in task.FAIL_TO_PASS)
    ev["p2p_passed"] = sum(TestStatus(tests[t]).ok for t in task.PASS_TO_PASS)
    ev["duration_s"] = round(time.monotonic() - t0, 3)
    if TAMPER in flags and cfg.penalize_tamper:
        return _outcome(Status.HACK_DETECTED, flags, tests, ev)
    return _outcome(Status.RESOLVED if verdict.resolved else Status.FAILED, flags, tests, ev)


def _django_aliases(parsed: dict[str, str], wanted: list[str]) -> dict[str, str]:
    """Django ids are `test_x (mod.Class)` up to Python 3.10 and `test_x (mod.Class.test_x)`
    since (unittest's `str(test)`); a task's ids in one format read a log in the other."""
    out = dict(parsed)
    for t in wanted:
        if t in out:
            continue
        name, _, rest = t.partition(" (")
        dotted = rest.rstrip(")")
        other = f"{name} ({dotted.rsplit('.', 1)[0]})" if dotted.endswith("." + name) else f"{name} ({dotted}.{name})"
        if other in parsed:
            out[t] = parsed[other]
    return out


def _untagged(stdout: str, nonce: str) -> str:
    """The run's stdout without the supervisor's tagged summary (evidence only)."""
    return "\n".join(ln for ln in stdout.splitlines() if not ln.startswith(nonce + " "))


def guarded_files(paths: list[str]) -> list[str]:
    """The task's test modules and the conftests pytest loads for them (those of their
    directories up to the root): no honest run writes to them. Data files are left out, as
    tests may regenerate those."""
    out = {p for p in paths if p.endswith(".py")}
    for p in list(out):
        parts = p.split("/")[:-1]
        out |= {"/".join([*parts[:i], "conftest.py"]) for i in range(len(parts) + 1)}
    return sorted(out)


def canary_host(task: Task, directives: list[str]) -> tuple[str | None, list[str]]:
    """The task test file to plant the canaries in, and its tests' function names.

    A file that holds FAIL_TO_PASS tests, so that sparing "other files" spares nothing; the
    names make the canaries look like that file's tests (`test_merge` → `test_merge_nested`).
    """
    for tid in task.FAIL_TO_PASS + task.PASS_TO_PASS:
        file = tid.split("::", 1)[0]
        if file.endswith(".py") and any(covers(d, tid) for d in directives) and not any("::" in d for d in directives):
            names = [
                t.split("::")[-1].split("[", 1)[0]
                for t in task.FAIL_TO_PASS + task.PASS_TO_PASS
                if t.startswith(file + "::")
            ]
            return file, names
    return None, []


async def grade(task: Task, diff: str, backend: Backend, image: str, cfg: GradeConfig | None = None) -> Outcome:
    """Grade `diff` for `task` in a fresh sandbox from `image`: one attempt. A fault of ours
    is a masked `infra_error` (the rollout worker, the one owner of retries, runs the whole
    rollout again in a fresh sandbox and session); when the sandbox died while the agent's
    code ran, a control run with the empty diff decides whose fault it was."""
    if task.kind == "harbor":  # graded by its verifier's reward, on the workdir's state (state_grade.py)
        from legorl.verify.state_grade import grade_state

        return await grade_state(task, diff, backend, image)
    cfg = cfg or GradeConfig()
    outcome, err, step = await _attempt(task, diff, backend, image, cfg)
    if outcome is not None:
        return outcome
    errors = [err]
    if diff.strip() and step == "tests":
        control, cerr, _ = await _attempt(task, "", backend, image, cfg)
        if control is not None:  # the machinery works: the agent's code took the sandbox down
            return Outcome(0.0, Status.FAILED, flags=["grader_sandbox_killed"], evidence={"errors": errors})
        errors.append(f"control: {cerr}")
    return Outcome(
        0.0, Status.INFRA_ERROR, masked=True, evidence={"cause": Status.GRADER_ERROR.value, "errors": errors}
    )


async def _attempt(
    task: Task, diff: str, backend: Backend, image: str, cfg: GradeConfig
) -> tuple[Outcome | None, str, str]:
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
