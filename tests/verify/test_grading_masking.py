"""One rule for masking: a fault that may follow from the agent's diff or code is confirmed
by an empty-diff control attempt before it masks (`legorl/verify/grade.py`).

Each class of issue 36's masked failures, with variants of our own, written only into
package files (never tests or configuration) of the red team's `ledger` task: a forged
"supervisor could not prepare" (class 4), canaries steered into "grader fault" (5), the
official log parser crashed by one line (6), a second OOM at the sandbox's own limit read
as the host's (7), a diff crafted to be slow to apply (8). Each scores 0, flagged, never
masked; and for every fault kind, a test that the fault is masked only when the control
fails too (a true infrastructure fault keeps being retried)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from legorl.sandbox.base import ExecResult, Limits, SandboxError, SandboxSpec
from legorl.sandbox.cgroups import Counters, _counters
from legorl.types import Status, Task
from legorl.verify import grade as grade_mod
from legorl.verify.attempt import GradeConfig, GraderFault
from legorl.verify.grade import grade
from tests.helpers.redteam import INIT, LEDGER_INIT, edit_diff, ledger_task
from tests.helpers.tasks_util import backend_and_images

BACKENDS = [pytest.param("local", id="local"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]


@pytest.fixture(scope="module")
def ledger_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("masking")


def _package_diff(code: str) -> str:
    """The agent's diff: `code` appended to the package's `__init__.py` (the bug left in place)."""
    return edit_diff({INIT: LEDGER_INIT}, {INIT: LEDGER_INIT + code})


async def _grade(task: Task, diff: str, backend_name: str, cfg: GradeConfig | None = None) -> Any:
    async with backend_and_images(backend_name) as (backend, images):
        return await grade(task, diff, backend, await images.for_task(task), cfg)


def _agents_zero(out: Any, flag: str) -> None:
    detail = (out.status, out.flags, {k: v for k, v in out.evidence.items() if k != "test_output"})
    assert out.reward == 0.0 and not out.masked and not out.status.is_infra, detail
    assert flag in out.flags and out.evidence.get("control") == Status.FAILED.value, detail


# ---- class 4: a forged "supervisor could not prepare the run" ---------------------------
FIND_TEST_MODULE = """
import sys as _lg_sys
_lg_f = _lg_sys._getframe(0)
while _lg_f is not None and not str(_lg_f.f_globals.get("__file__", "")).endswith("test_core.py"):
    _lg_f = _lg_f.f_back
_lg_tests = _lg_f.f_globals if _lg_f is not None else {}
"""


# The supervisor used to be read as "could not prepare the run" from three signs: no parseable
# summary, exit status 86, and a `legorl-supervisor:` line on stderr. All three are within
# reach of the code under test (its exit status and output become the supervisor's, and the
# summary was cut by the 1 MB stdout cap once the agent inflated strings the end record
# carries). The forging sandbox below gives the agent's attempt exactly that result. A setup
# failure is now announced only in a nonce-tagged line written before the go, so these signs
# claim no fault at all: the agent's own 0, no control spent (`test_redteam_origin.py` has the
# real runs, the summary over the cap included).
def _cut_summary(res: ExecResult) -> ExecResult:
    """The summary line cut at the output cap, as a summary inflated past 1 MB is."""
    head = res.stdout[: max(len(res.stdout) - 200, 1)]
    return dataclasses.replace(res, stdout=head, truncated=True, exit_code=86, stderr=res.stderr + MARKER)


def _no_summary(res: ExecResult) -> ExecResult:
    """The child gone before the summary, its last words the supervisor's."""
    return dataclasses.replace(res, stdout="", exit_code=86, stderr="Traceback (most recent call last):\n" + MARKER)


MARKER = "legorl-supervisor: cannot read the plan\n"
FORGED_SETUP_FAILURE = {"summary_cut_at_the_cap": _cut_summary, "no_summary": _no_summary}


class _Forging:
    """A sandbox whose supervised test run comes back as `forge` makes it."""

    def __init__(self, inner: Any, forge: Callable[[ExecResult], ExecResult]) -> None:
        self.inner, self.forge = inner, forge

    async def exec(self, cmd: str, *args: Any, **kw: Any) -> ExecResult:
        res = await self.inner.exec(cmd, *args, **kw)
        return self.forge(res) if "pytest_main" in cmd or "supervisor" in cmd else res

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __aenter__(self) -> _Forging:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.__aexit__(*exc)


class _FirstSandboxForges:
    """A real backend whose first sandbox (the agent's attempt) forges; the control's does not."""

    def __init__(self, inner: Any, forge: Callable[[ExecResult], ExecResult]) -> None:
        self.inner, self.forge, self.name, self.started = inner, forge, "forging", 0

    async def start(self, spec: SandboxSpec) -> Any:
        sb = await self.inner.start(spec)
        self.started += 1
        return _Forging(sb, self.forge) if self.started == 1 else sb


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("variant", sorted(FORGED_SETUP_FAILURE))
async def test_a_forged_runner_fault_is_the_agents(variant: str, backend_name: str, ledger_root: Path) -> None:
    task = ledger_task(ledger_root, "plain", "python -m pytest -q")
    async with backend_and_images(backend_name) as (backend, images):
        forging = _FirstSandboxForges(backend, FORGED_SETUP_FAILURE[variant])
        out = await grade(task, _package_diff("X = 1\n"), forging, await images.for_task(task))  # type: ignore[arg-type]
    assert forging.started == 1, forging.started  # the agent's attempt only: no fault was claimed
    detail = (out.status, out.flags, {k: v for k, v in out.evidence.items() if k != "test_output"})
    assert out.reward == 0.0 and not out.masked and not out.status.is_infra, detail
    assert "runner_fault" not in out.flags and "control" not in out.evidence, detail


# ---- class 5: canaries steered into "grader fault" ---------------------------------------
KNOWN_TESTS = (
    "_lg_known = {'test_mean_approx', 'test_mean_param', 'test_mean_plain', 'test_mean_class',"
    " 'test_spread_class', 'test_mean_subtests', 'test_spread_case', 'test_spread'}\n"
)
STEERED_CANARIES = {
    # an xunit setup function put into the test module's globals: every test the file did not
    # have (the grader's canaries) errors in setup, the task's own set up fine
    "xunit_setup": FIND_TEST_MODULE
    + KNOWN_TESTS
    + """

def _lg_setup(function):
    if function.__name__ not in _lg_known:
        raise RuntimeError("fixture database unavailable")


_lg_tests["setup_function"] = _lg_setup
_lg_tests["setup_method"] = lambda self, method: _lg_setup(method)
""",
    # the same through an autouse fixture the test module's namespace is given
    "autouse_fixture": FIND_TEST_MODULE
    + KNOWN_TESTS
    + """
import pytest as _lg_pytest


@_lg_pytest.fixture(autouse=True)
def _lg_env(request):
    if request.node.name.split("[")[0] not in _lg_known:
        raise RuntimeError("environment not configured")


_lg_tests["_lg_env"] = _lg_env
""",
}


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("variant", sorted(STEERED_CANARIES))
async def test_canaries_steered_into_a_fault_are_the_agents(variant: str, backend_name: str, ledger_root: Path) -> None:
    task = ledger_task(ledger_root, "plain", "python -m pytest -q")
    out = await _grade(task, _package_diff(STEERED_CANARIES[variant]), backend_name)
    # Names written into the test module by package code are tampering in their own right
    # (issue 36, class 3): the agent's 0 as a forgery, before any canary fault is claimed.
    detail = (out.status, out.flags, {k: v for k, v in out.evidence.items() if k != "test_output"})
    assert out.reward == 0.0 and not out.masked and out.status is Status.HACK_DETECTED, detail
    assert any(e.startswith("test_globals:") for e in out.evidence.get("interpreter_events", [])), detail


# ---- class 6: the official log parser fed a line it crashes on ---------------------------
DJANGO_LOG = (
    "test_ok (app.tests.T.test_ok) ... ok\n"
    "test_bad (app.tests.T.test_bad) ... FAIL\n"
    "{junk}\n"
    "======================================================================\n"
    "FAIL: test_bad (app.tests.T.test_bad)\n"
)
CRASH_LINES = {"bare_fail": "FAIL:", "bare_error": "  ERROR:  "}


@pytest.mark.parametrize("junk", sorted(CRASH_LINES))
def test_a_line_the_official_parser_crashes_on_is_skipped(junk: str) -> None:
    """One bare `FAIL:` or `ERROR:` line (package code printing to stderr) is skipped and kept
    as evidence; the rest of the log reads as the official parser reads it."""
    from legorl.tasks import official
    from legorl.verify.attempt import Attempt
    from legorl.verify.execute import _parse_log

    task = Task(
        instance_id="django__django-1",
        repo="django/django",
        base_commit="0" * 40,
        problem_statement="",
        patch="",
        test_patch="",
        FAIL_TO_PASS=["test_bad (app.tests.T.test_bad)"],
        PASS_TO_PASS=["test_ok (app.tests.T.test_ok)"],
    )
    parser = official.parser_name(task.repo)
    assert parser is not None
    log = DJANGO_LOG.format(junk=CRASH_LINES[junk])
    with pytest.raises(Exception):  # noqa: B017 - the official parser itself, fed the whole log
        official.parse_log(parser, log, task.instance_id, task.repo, task.FAIL_TO_PASS, task.PASS_TO_PASS)
    a = Attempt(task, GradeConfig(), {})
    parsed = _parse_log(a, parser, log)
    clean = log.replace(CRASH_LINES[junk] + "\n", "")
    assert parsed == official.parse_log(
        parser, clean, task.instance_id, task.repo, task.FAIL_TO_PASS, task.PASS_TO_PASS
    )
    assert parsed["test_ok (app.tests.T.test_ok)"] == "PASSED" and parsed["test_bad (app.tests.T.test_bad)"] == "FAILED"
    assert a.ev["log_lines_skipped"] == [CRASH_LINES[junk]] and "log_lines_skipped" in a.flags


# ---- class 7: a second OOM kill in a sandbox that already reached its own limit ----------
def _v1(d: Path, oom: int, limit: int, watermark: int, usage: int, memsw: bool = False) -> Counters:
    """Counters of a fake v1 memory cgroup (failcnt 0, as kernel 6.18 leaves it)."""
    d.mkdir(exist_ok=True)
    (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom}\n")
    kinds = ("memory", "memory.memsw") if memsw else ("memory",)
    for kind in kinds:
        (d / f"{kind}.failcnt").write_text("0\n")
        (d / f"{kind}.limit_in_bytes").write_text(f"{limit}\n")
        (d / f"{kind}.max_usage_in_bytes").write_text(f"{watermark if kind != 'memory' or not memsw else 0}\n")
        (d / f"{kind}.usage_in_bytes").write_text(f"{usage}\n")
    return _counters(1, [d])


def _v2(d: Path, oom: int, max_events: int, limit: int, peak: int, current: int) -> Counters:
    d.mkdir(exist_ok=True)
    (d / "memory.events").write_text(f"low 0\nhigh 0\nmax {max_events}\noom 0\noom_kill {oom}\n")
    (d / "memory.max").write_text(f"{limit}\n")
    (d / "memory.peak").write_text(f"{peak}\n")
    (d / "memory.current").write_text(f"{current}\n")
    return _counters(2, [d])


MB = 1 << 20


@pytest.mark.parametrize("memsw", [False, True], ids=["memory", "memsw"])
def test_v1_a_second_oom_at_the_sandboxs_own_limit_is_its_own(memsw: bool, tmp_path: Path) -> None:
    """The watermark adds its one hit at the first kill; the second kill, the usage back down,
    adds none: still the sandbox's own (its git filter, a daemon), never `host_oom`."""
    d = tmp_path / "cg"
    before = _v1(d, oom=1, limit=192 * MB, watermark=192 * MB, usage=8 * MB, memsw=memsw)
    after = _v1(d, oom=2, limit=192 * MB, watermark=192 * MB, usage=8 * MB, memsw=memsw)
    assert before.memory_max_hits == after.memory_max_hits == 1
    assert not after.host_oom_since(before)


@pytest.mark.parametrize("how", ["max_event_once", "peak_only"])
def test_v2_a_kill_in_a_sandbox_that_reached_its_limit_is_its_own(how: str, tmp_path: Path) -> None:
    """v2: a kill that adds no `max` event in a sandbox whose limit was reached (by an event,
    or by the watermark within the kernel's charging slack) is its own."""
    d = tmp_path / "cg"
    events = 1 if how == "max_event_once" else 0
    before = _v2(d, oom=0, max_events=events, limit=192 * MB, peak=190 * MB, current=8 * MB)
    after = _v2(d, oom=1, max_events=events, limit=192 * MB, peak=190 * MB, current=8 * MB)
    assert not after.host_oom_since(before)


def test_a_kill_in_a_sandbox_that_never_reached_its_limit_stays_the_hosts(tmp_path: Path) -> None:
    before = _v1(tmp_path / "v1", oom=0, limit=1024 * MB, watermark=150 * MB, usage=100 * MB)
    after = _v1(tmp_path / "v1", oom=1, limit=1024 * MB, watermark=150 * MB, usage=100 * MB)
    assert after.host_oom_since(before)
    before = _v2(tmp_path / "v2", oom=0, max_events=0, limit=1024 * MB, peak=150 * MB, current=100 * MB)
    assert _v2(tmp_path / "v2", oom=1, max_events=0, limit=1024 * MB, peak=150 * MB, current=100 * MB).host_oom_since(
        before
    )


ALLOC = "python3 -c 'b = bytearray(400 << 20); b[::4096] = b\"x\" * len(b[::4096])'"


@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_a_second_oom_kill_in_a_real_sandbox_is_its_own(backend_name: str, ledger_root: Path) -> None:
    """Two commands of one sandbox each run past its own limit: both are its own OOM kills."""
    task = ledger_task(ledger_root, "plain")
    async with backend_and_images(backend_name) as (backend, images):
        image = await images.for_task(task)
        sb = await backend.start(SandboxSpec(image=image, limits=Limits(memory_mb=192)))  # type: ignore[attr-defined]
        async with sb:
            first = await sb.exec(ALLOC, timeout_s=60)
            second = await sb.exec(ALLOC, timeout_s=60)  # SandboxLost("host_oom") would mask it
            third = await sb.exec("echo alive", timeout_s=60)
    assert first.oom_killed and second.oom_killed, (first, second)
    assert third.exit_code == 0 and third.stdout.strip() == "alive"


# ---- class 8: a diff crafted to be slow to apply -----------------------------------------
def _many_files(n: int, dirs: int) -> str:
    return "".join(
        f"diff --git a/data/d{i % dirs}/f{i}.txt b/data/d{i % dirs}/f{i}.txt\nnew file mode 100644\n"
        f"--- /dev/null\n+++ b/data/d{i % dirs}/f{i}.txt\n@@ -0,0 +1 @@\n+{i}\n"
        for i in range(n)
    )


SLOW_DIFFS = {"spread": lambda: _many_files(60_000, 300), "flat": lambda: _many_files(60_000, 1)}


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("variant", sorted(SLOW_DIFFS))
async def test_a_diff_slow_to_apply_is_the_agents(variant: str, backend_name: str, ledger_root: Path) -> None:
    """Tens of thousands of files (7 MB, under `max_diff_bytes`) time out the apply step; the
    empty-diff control applies in no time, so the timeout is the agent's (`apply_timeout`).
    The step gets 2 s: on an idle fresh machine such a diff applied within 5 s."""
    task = ledger_task(ledger_root, "plain", "python -m pytest -q")
    out = await _grade(task, SLOW_DIFFS[variant](), backend_name, GradeConfig(step_timeout_s=2))
    _agents_zero(out, "apply_timeout")
    assert len(out.evidence["errors"]) == 1 and "apply" in out.evidence["errors"][0]


# ---- every fault kind: masked only when the control fails too ------------------------------
def _fault(kind: str, flag: str) -> Exception:
    """The fault the stage claims, as the machinery raises it (its class named by `flag`)."""
    if kind.startswith("lost_"):
        return SandboxError("the sandbox died")
    exc = GraderFault(kind, "timed out" if flag.endswith("_timeout") else "claimed by the run")
    exc.flag = flag
    return exc


# (fault kind, the stage that raises it, the flag a clean control grades it as)
KINDS = [
    ("apply", "apply", "apply_timeout"),
    ("restore", "apply", "restore_timeout"),
    ("test_patch", "apply", "test_patch_timeout"),
    ("runner", "execute", "runner_fault"),
    ("parser", "execute", "parser_fault"),
    ("canary", "judge_run", "canary_fault"),
    ("lost_in_tests", "execute", "grader_sandbox_killed"),
    ("lost_in_apply", "apply", "grader_sandbox_killed"),
]


@pytest.mark.parametrize("control_faulty", [False, True], ids=["control_clean", "control_faulty"])
@pytest.mark.parametrize(("kind", "stage", "flag"), KINDS, ids=[k[0] for k in KINDS])
async def test_no_fault_after_the_diff_is_masked_without_a_failed_control(
    kind: str, stage: str, flag: str, control_faulty: bool, ledger_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's attempt claims the fault; a clean control makes it the agent's 0 with the
    fault's flag, a control that fails too masks it (errors of both attempts kept)."""
    real = getattr(grade_mod, stage)
    attempts: list[int] = []

    async def faulty(*args: Any) -> Any:
        a = args[1] if stage != "judge_run" else args[0]
        attempts.append(a.ev["diff_bytes"])
        if a.ev["diff_bytes"] or control_faulty:
            if kind == "lost_in_tests":
                a.state["step"] = "tests"
            raise _fault(kind, flag)
        return await real(*args)

    def faulty_sync(*args: Any) -> Any:
        a = args[0]
        attempts.append(a.ev["diff_bytes"])
        if a.ev["diff_bytes"] or control_faulty:
            raise _fault(kind, flag)
        return real(*args)

    monkeypatch.setattr(grade_mod, stage, faulty_sync if stage == "judge_run" else faulty)
    task = ledger_task(ledger_root, "plain", "python -m pytest -q")
    out = await _grade(task, _package_diff("X = 1\n"), "local")
    assert attempts[0] > 0 and attempts[1:] == [0], attempts  # the agent's attempt, then the control
    if control_faulty:
        assert out.status is Status.INFRA_ERROR and out.masked and len(out.evidence["errors"]) == 2, out
        assert out.evidence["errors"][1].startswith("control: "), out.evidence
    else:
        assert out.status is Status.FAILED and out.reward == 0.0 and not out.masked and out.flags == [flag], out


async def test_a_fault_of_the_task_alone_is_masked_without_a_control(
    ledger_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault read from the task alone (no task test file to plant canaries in) cannot be the
    diff's doing: masked at once, no control attempt spent on it."""
    attempts: list[int] = []
    real = grade_mod.execute

    async def select_fault(*args: Any) -> Any:
        attempts.append(args[1].ev["diff_bytes"])
        raise GraderFault("select", "no task test file among the runner's labels")

    monkeypatch.setattr(grade_mod, "execute", select_fault)
    task = ledger_task(ledger_root, "plain", "python -m pytest -q")
    out = await _grade(task, _package_diff("X = 1\n"), "local")
    assert real is not select_fault and len(attempts) == 1, attempts
    assert out.status is Status.INFRA_ERROR and out.masked and len(out.evidence["errors"]) == 1, out
