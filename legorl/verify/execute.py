"""Stage 4 of grading: run the task's tests under the supervisor and read back what it produced.

The tests run as stage 1 selected them, canaries planted among the task's own tests, under
the supervised runner: `pytest_plan.py` + `in_sandbox/pytest_main.py` for pytest, `native.py` +
`in_sandbox/native_main.py` for Django's and SymPy's own runners. What comes back is read, not
judged: the supervisor's nonce-tagged summary line, and the JUnit report (pytest) or the
runner's log as the official SWE-bench parser reads it (native). Stage 5 (`judge.py`)
decides from them. A supervisor that says, in a line tagged with the nonce before the go,
that it could not even prepare the run is a `GraderFault`, claimed and confirmed by an
empty-diff control (`runner_fault`); no summary after the go is the code under test's doing.
A large summary comes in a file the tagged line names (the output cap is 1 MB). The official
log parser is fed defensively: a line it crashes on (one bare `FAIL:` printed by package code)
is skipped and kept as evidence, and a crash that remains is a claimed fault like the
runner's (`parser_fault`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from legorl.sandbox.base import ExecResult, Sandbox
from legorl.verify.apply import Applied
from legorl.verify.attempt import Attempt, GraderFault, exec_step
from legorl.verify.junit import ReportError, TestStatus, parse_junit
from legorl.verify.native import plan_native
from legorl.verify.prepare import Workspace
from legorl.verify.pytest_plan import RunnerPlan, parse_summary, plan_run, tagged_lines
from legorl.verify.selection import Selection, guarded_files
from legorl.verify.test_command import NativeCommand


@dataclass(frozen=True)
class PytestRun:
    """What a supervised pytest run left: its result, its plan, the summary and the report."""

    result: ExecResult
    plan: RunnerPlan
    summary: dict[str, Any] | None  # the supervisor's one tagged line (None: none, or several)
    tags: int  # how many lines carried the tag
    report: dict[str, TestStatus] | None  # the JUnit report (None: missing or unparsable)
    report_sha256: str | None
    agent_files: frozenset[str]  # whose code is whose, for the verdict (stage 3's `Applied`)


@dataclass(frozen=True)
class NativeRun:
    """What a supervised run of a native runner left: the summary and the official parse of its log."""

    result: ExecResult
    cmd: NativeCommand
    summary: dict[str, Any] | None
    tags: int
    log_sha256: str | None
    parsed: dict[str, str] | None  # test id -> official status (None: no log)
    agent_files: frozenset[str]


async def execute(sb: Sandbox, a: Attempt, sel: Selection, ws: Workspace, applied: Applied) -> PytestRun | NativeRun:
    """Stage 4: the task's tests, by its runner."""
    sel.check()
    if sel.native is not None:
        return await _execute_native(sb, a, sel, sel.native, ws, applied)
    return await _execute_pytest(sb, a, sel, ws, applied)


async def _execute_pytest(sb: Sandbox, a: Attempt, sel: Selection, ws: Workspace, applied: Applied) -> PytestRun:
    assert sel.pytest is not None  # `select` gives pytest arguments whenever there is no native runner
    plan = plan_run(
        a.cfg.repo_dir,
        sel.pytest.args,
        python=a.cfg.python,
        tmp_root=ws.dir,
        plant_in=sel.host,
        like=sel.like,
        guard=guarded_files([*sel.protected, *sel.pytest.directives]),
        wanted=a.wanted,
        agent_files=sorted(applied.agent_files),
    )
    a.ev["test_args"] = sel.pytest.args
    dirs = {plan.work_dir} | ({plan.canary_path.rsplit("/", 1)[0]} if plan.canary_source else set())
    run = await _run(sb, a, plan.command, plan.files, dirs)
    _record(a, run, (run.stderr[-3000:] + ("\n" + _untagged(run.stdout, plan.nonce)[-1500:])).strip())
    summary, tags = await _summary(sb, a, run, plan.nonce)
    report: dict[str, TestStatus] | None = None
    sha: str | None = None
    try:
        data = await sb.read_file(plan.junit_path)
        sha = hashlib.sha256(data).hexdigest()
        report = parse_junit(data)
        a.ev["report"] = "ok"
    except OSError:
        a.ev["report"] = "missing"
    except ReportError as exc:
        a.ev["report"] = f"invalid: {exc}"
    return PytestRun(run, plan, summary, tags, report, sha, applied.agent_files)


async def _execute_native(
    sb: Sandbox, a: Attempt, sel: Selection, cmd: NativeCommand, ws: Workspace, applied: Applied
) -> NativeRun:
    """A native runner (`native.py`): the official parser reads the log the supervisor kept."""
    from legorl.tasks import official

    task = a.task
    parser = official.parser_name(task.repo, task.log_parser)
    if parser is None:
        raise GraderFault("parser", f"no official log parser for repository {task.repo!r}", flag="")
    if sel.host is None:
        raise GraderFault("select", f"no task test file among the runner's labels {cmd.labels} to plant canaries in")
    tests_py = [p for p in sel.protected if p.endswith(".py")]
    plan = plan_native(
        a.cfg.repo_dir,
        cmd,
        a.cfg.python,
        ws.dir,
        sel.host,
        sel.like,
        sel.like_classes,
        tests_py,
        a.wanted,
        tests_py,
        sorted(applied.agent_files),
    )
    a.ev["test_args"] = [cmd.script, *cmd.args]
    a.ev["runner"] = cmd.runner
    run = await _run(sb, a, plan.command, plan.files, {plan.work_dir})
    _record(a, run, run.stderr[-3000:].strip())
    summary, tags = await _summary(sb, a, run, plan.nonce)
    log, sha = "", None
    try:
        data = await sb.read_file(plan.log_path)
        sha, log = hashlib.sha256(data).hexdigest(), data.decode("utf-8", "replace")
        a.ev["report"] = "ok"
    except OSError:
        a.ev["report"] = "missing"
    parsed = _parse_log(a, parser, log) if log else None
    a.ev["log_parser"] = parser
    if parsed is not None and cmd.runner == "django":
        parsed = django_aliases(parsed, a.wanted)
    return NativeRun(run, cmd, summary, tags, sha, parsed, applied.agent_files)


def _parse_log(a: Attempt, parser: str, log: str) -> dict[str, str]:
    """The official parse of `log`. The log holds whatever the code under test printed, and
    the official parsers index into lines they matched by prefix (`FAIL:` alone raises), so
    when the whole log does not parse, each line is tried alone: those the parser raises on
    are dropped (evidence `log_lines_skipped`) and the rest parsed. A parser that still
    raises is a claimed fault, confirmed by the control (`grade()`)."""
    from legorl.tasks import official

    t = a.task

    def parse(text: str) -> dict[str, str]:
        return official.parse_log(parser, text, t.instance_id, t.repo, t.FAIL_TO_PASS, t.PASS_TO_PASS)

    try:
        return parse(log)
    except Exception:  # noqa: BLE001 - any crash of a third-party parser on a line is the line's
        pass
    lines = log.split("\n")
    bad = {i for i, line in enumerate(lines) if _raises(parse, line)}
    a.ev["log_lines_skipped"] = [lines[i][:200] for i in sorted(bad)[:20]]
    a.flags.append("log_lines_skipped")
    try:
        return parse("\n".join(line for i, line in enumerate(lines) if i not in bad))
    except Exception as exc:  # noqa: BLE001 - ours to look at, never the agent's reward
        raise GraderFault("parser", f"{parser} failed on the log: {type(exc).__name__}: {exc}") from None


def _raises(parse: Callable[[str], dict[str, str]], line: str) -> bool:
    try:
        parse(line)
    except Exception:  # noqa: BLE001
        return True
    return False


async def _run(sb: Sandbox, a: Attempt, command: str, files: dict[str, str], dirs: set[str]) -> ExecResult:
    """Write the plan's files and run its command; `state["step"]` is "tests" while it runs."""
    await exec_step(sb, "runner", "mkdir -p " + " ".join(shlex.quote(d) for d in sorted(dirs)), a.cfg)
    for path, text in files.items():
        await sb.write_file(path, text.encode())
    a.state["step"] = "tests"
    run = await sb.exec(command, timeout_s=a.cfg.test_timeout_s, cwd=a.cfg.repo_dir)
    a.state["step"] = "report"
    return run


def _record(a: Attempt, run: ExecResult, output: str) -> None:
    """The run's exit, output tail and duration as evidence; a timeout or exhaustion as flags."""
    a.ev["exit_code"] = run.exit_code
    a.ev["test_output"] = output
    a.ev["test_duration_s"] = round(run.duration_s, 3)
    if run.timed_out:
        a.flags.append("test_timeout")
    if run.resource_exhausted:
        a.flags.append("resource_exhausted")


async def _summary(sb: Sandbox, a: Attempt, run: ExecResult, nonce: str) -> tuple[dict[str, Any] | None, int]:
    """The supervisor's summary: its one tagged line, or the file that line names (a large
    summary, checked against the sha256 the line carries). A claimed GraderFault
    (`runner_fault`, confirmed by the control) only when the supervisor said, in a line tagged
    before any code under test ran, that it could not prepare the run: an exit status and a
    message on stderr are the code under test's to forge, and a summary that does not parse
    after the go is its doing (a run without a summary scores 0)."""
    found = tagged_lines(run.stdout, nonce)
    if len(found) == 1 and found[0].startswith("setup-failed "):
        raise GraderFault("runner", found[0][len("setup-failed ") :][:800])
    if len(found) == 1 and found[0].startswith("file "):
        _, sha, path = (found[0].split(" ", 2) + ["", ""])[:3]
        try:
            data = await sb.read_file(path)
        except OSError as exc:
            a.ev["summary_file"] = f"unreadable: {exc}"
            return None, 1
        if hashlib.sha256(data).hexdigest() != sha:
            a.ev["summary_file"] = "does not match the tagged line"
            return None, 1
        try:
            got = json.loads(data)
        except ValueError:
            return None, 1
        return (got if isinstance(got, dict) else None), 1
    return parse_summary(run.stdout, nonce)


def django_aliases(parsed: dict[str, str], wanted: list[str]) -> dict[str, str]:
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
