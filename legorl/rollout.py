"""One rollout end to end: agent stage → extract the diff → grade in a fresh sandbox.

    backend = open_backend("local")
    image = await TaskImages(backend="local").for_task(task)
    result = await run_rollout(task, CommandHarness.from_file("fix.sh"), backend, image)
    # through a proxy session: run_rollout(..., proxy=SandboxSocket("/tmp/s.sock"))
    print(result.to_json())      # instance_id, status, reward, masked, flags, tests, …

Failure classes (docs/architecture.md, "Rules that keep the pillars honest"):
- agent-caused, trained on with reward 0: the diff fails the tests (`failed`), no diff
  (`no_patch`), the harness ran out of time (`agent_timeout`) or turns (`max_turns`),
  malformed model output (`format_error`), a crash the agent caused in its own sandbox
  (`agent_crash`: its repository yields no diff, or it took its sandbox down while a fresh
  one from the same image works, or it exhausted memory, pids or disk), and visible tamper
  attempts (`hack_detected`).
- infrastructure: `infra_error` with `masked=True` (left out of the loss and of the group's
  statistics) and the cause in the evidence: the sandbox did not start, the sandbox
  machinery failed, the engine failed (`engine_error` reported by the harness/proxy), the
  grader failed. One attempt here: the rollout worker (loop/worker.py) is the one owner of
  retries, each in a fresh sandbox *and* a fresh proxy session.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from legorl.harness.base import AgentRun, Harness, HostHarness, InstalledHarness
from legorl.sandbox.base import Backend, DiffError, Limits, Sandbox, SandboxError, SandboxLost, SandboxSpec
from legorl.tasks.kinds import kind_of
from legorl.tasks.kinds.base import AgentStage, TaskKind
from legorl.types import Outcome, Status, Task
from legorl.verify.grade import GradeConfig, grade

AGENT_STATUSES_WITHOUT_GRADING = {Status.MAX_TURNS, Status.FORMAT_ERROR, Status.AGENT_TIMEOUT, Status.AGENT_CRASH}


@dataclass(frozen=True)
class SandboxSocket:
    """How a harness inside its sandbox reaches its proxy session: this unix socket (only
    that session answers on it) is forwarded into the sandbox, its only way out, and the
    harness calls it at the sandbox's proxy port."""

    path: str


@dataclass(frozen=True)
class HostLoopback:
    """How a `HostHarness` (its process beside the sandboxes) reaches its proxy session: the
    session's loopback URL. Its sandbox gets no socket, and so no network at all."""

    url: str


# One value says how the agent reaches its session; the rollout worker chooses it, once.
ProxyAccess = SandboxSocket | HostLoopback


@dataclass(frozen=True)
class RolloutConfig:
    """Limits and retry policy of one rollout."""

    agent_timeout_s: float = 600.0  # wall-clock budget of the harness run ([sandbox] agent_timeout_s)
    limits: Limits = field(default_factory=Limits)  # of the agent sandbox
    repo_dir: str = "/repo"
    grade_empty_diff: bool = False  # an empty diff is `no_patch` without running the tests
    grade: GradeConfig = field(default_factory=GradeConfig)
    env: dict[str, str] = field(default_factory=dict)  # of the agent sandbox (a Harbor image's ENV)

    def for_kind(self, kind: TaskKind) -> RolloutConfig:
        """This config with the agent stage the task's kind shapes (a Harbor task's workdir,
        ENV, limits and agent timeout come from the task)."""
        stage = kind.agent_stage(AgentStage(self.repo_dir, self.agent_timeout_s, self.limits, dict(self.env)))
        return dataclasses.replace(
            self, repo_dir=stage.workdir, agent_timeout_s=stage.timeout_s, limits=stage.limits, env=stage.env
        )


@dataclass(frozen=True)
class RolloutResult:
    """One attempt's decisions: its verdict (`outcome`), the diff, the agent run and the
    stage timings. Frozen: the worker's record (loop/record.py) builds on it, never into it."""

    instance_id: str
    harness: str
    outcome: Outcome
    diff: str = ""
    agent: AgentRun | None = None
    attempts: int = 1
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The one-line summary `legorl rollout` prints (plus the evidence)."""
        o = self.outcome
        return {
            "instance_id": self.instance_id,
            "harness": self.harness,
            "status": o.status.value,
            "reward": o.reward,
            "masked": o.masked,
            "flags": o.flags,
            "tests": o.tests,
            "attempts": self.attempts,
            "diff_bytes": len(self.diff.encode()),
            "agent_exit_code": self.agent.exit_code if self.agent else None,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "evidence": o.evidence,
        }


class _Infra(Exception):
    """An infrastructure fault of the agent stage; retried by the worker. `flag` names a
    known cause (`killed_by_signal_9`, `backend_died`)."""

    def __init__(self, status: Status, message: str, flag: str = "", evidence: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.flag = flag
        self.evidence = evidence or {}


async def _lost(sb: Sandbox, exc: SandboxError) -> str:
    """The cause when the sandbox was taken down from outside, "" when it may be the agent's."""
    if isinstance(exc, SandboxLost):
        return exc.cause
    try:
        return await sb.lost_cause() or ""
    except SandboxError:
        return ""


async def _probe(backend: Backend, image: str, repo_dir: str) -> bool:
    """Does a fresh sandbox from `image` start and run a command? (Decides who broke one.)"""
    try:
        sb = await backend.start(SandboxSpec(image=image, workdir=repo_dir))
        async with sb:
            res = await sb.exec("true", timeout_s=30)
            return res.exit_code == 0
    except SandboxError:
        return False


async def _agent_stage(
    task: Task,
    kind: TaskKind,
    harness: Harness,
    backend: Backend,
    image: str,
    cfg: RolloutConfig,
    proxy: ProxyAccess | None,
    timings: dict[str, float],
) -> tuple[AgentRun, str, Outcome | None]:
    """Run the harness; return (run, diff, an agent-caused outcome that ends the rollout or None)."""
    on_host = isinstance(harness, HostHarness)  # its process is beside the sandbox: no socket, no mounts
    if proxy is not None and on_host != isinstance(proxy, HostLoopback):
        want = "a HostLoopback URL" if on_host else "a SandboxSocket"
        raise ValueError(f"harness {harness.name!r} reaches its proxy session through {want}, not {proxy!r}")
    # A native harness brings its installation as read-only layers (legorl/harness/install.py).
    mounts = dict(harness.readonly_mounts) if isinstance(harness, InstalledHarness) and not on_host else {}
    spec = SandboxSpec(
        image=image,
        limits=cfg.limits,
        workdir=cfg.repo_dir,
        proxy_socket=proxy.path if isinstance(proxy, SandboxSocket) else None,
        readonly_mounts=mounts,
        env=dict(cfg.env),
    )
    t0 = time.monotonic()
    try:
        sb: Sandbox = await backend.start(spec)
    except SandboxError as exc:
        raise _Infra(Status.SANDBOX_START_FAILED, str(exc), exc.cause if isinstance(exc, SandboxLost) else "") from None
    timings["sandbox_start_s"] = time.monotonic() - t0
    timings["t_harness_start"] = time.time()  # wall clock, comparable with the turns' t_start
    if isinstance(proxy, HostLoopback):
        proxy_url: str | None = proxy.url
    else:
        proxy_url = f"http://127.0.0.1:{spec.proxy_port}" if proxy is not None else None
    async with sb:
        try:
            t1 = time.monotonic()
            run = await harness.run(sb, task, proxy_url, cfg.repo_dir, cfg.agent_timeout_s)
            timings["harness_s"] = time.monotonic() - t1
        except SandboxError as exc:
            if cause := await _lost(sb, exc):  # killed from outside / backend gone: never the agent's
                raise _Infra(
                    Status.INFRA_ERROR, f"sandbox lost during the agent stage ({cause}): {exc}", cause
                ) from None
            if await _probe(backend, image, cfg.repo_dir):  # the machinery works: the agent broke its sandbox
                run = AgentRun(exit_code=-1, details={"error": str(exc)})
                return run, "", Outcome(0.0, Status.AGENT_CRASH, flags=["sandbox_killed"], evidence={"error": str(exc)})
            raise _Infra(Status.SANDBOX_START_FAILED, f"sandbox lost during the agent stage: {exc}") from None
        if run.status is not None and run.status.is_infra:  # the harness's own flag and evidence go along
            extra = {k: v for k, v in run.details.items() if k not in ("error", "flag")}
            message = run.details.get("error", f"harness reported {run.status.value}")
            raise _Infra(run.status, message, run.details.get("flag", ""), extra)
        if run.status is None and run.timed_out:
            run = dataclasses.replace(run, status=Status.AGENT_TIMEOUT)
        try:
            t2 = time.monotonic()
            diff = await kind.changes(sb, cfg.repo_dir)  # a git diff, or a Harbor workdir's state
            timings["diff_s"] = time.monotonic() - t2
        except DiffError as exc:
            flags = ["resource_exhausted"] if run.resource_exhausted else []
            return run, "", Outcome(0.0, Status.AGENT_CRASH, flags=flags + ["no_diff"], evidence={"error": str(exc)})
        except SandboxError as exc:
            if cause := await _lost(sb, exc):
                raise _Infra(Status.INFRA_ERROR, f"sandbox lost extracting the diff ({cause}): {exc}", cause) from None
            if await _probe(backend, image, cfg.repo_dir):
                return run, "", Outcome(0.0, Status.AGENT_CRASH, flags=["sandbox_killed"], evidence={"error": str(exc)})
            raise _Infra(Status.SANDBOX_START_FAILED, f"sandbox lost extracting the diff: {exc}") from None
    return run, diff, None


async def run_rollout(
    task: Task,
    harness: Harness,
    backend: Backend,
    image: str,
    cfg: RolloutConfig | None = None,
    proxy: ProxyAccess | None = None,
) -> RolloutResult:
    """One rollout of `harness` on `task` in sandboxes from `image` (a task image key).
    `proxy` is how the agent reaches its proxy session: a `SandboxSocket` for a harness
    that runs in the sandbox, a `HostLoopback` URL for a `HostHarness` (None: no proxy).
    The result's outcome is this attempt's verdict, built once from the stages' decisions
    (the worker's record adds what only it knows: legorl/loop/record.py)."""
    kind = kind_of(task)  # chosen once, passed along to every stage
    cfg = (cfg or RolloutConfig()).for_kind(kind)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    run: AgentRun | None = None
    diff = ""
    ended: Outcome | None = None
    try:
        run, diff, ended = await _agent_stage(task, kind, harness, backend, image, cfg, proxy, timings)
    except _Infra as exc:  # retried by the caller (RolloutWorker) in a fresh sandbox and session
        errors = [f"{exc.status.value}: {exc}"]
        outcome = Outcome(
            0.0,
            Status.INFRA_ERROR,
            masked=True,
            flags=[exc.flag] if exc.flag else [],
            evidence={**exc.evidence, "cause": exc.flag or exc.status.value, "errors": errors},
        )
        return RolloutResult(task.instance_id, harness.name, outcome, timings={"agent_s": time.monotonic() - t0})
    timings["agent_s"] = time.monotonic() - t0
    assert run is not None
    agent_ev = {"agent_exit_code": run.exit_code, "agent_duration_s": round(run.duration_s, 3)}
    exhausted = ["resource_exhausted"] if run.resource_exhausted else []
    if ended is not None:  # the agent stage's own verdict, with the run's evidence
        outcome = dataclasses.replace(ended, evidence={**ended.evidence, **agent_ev})
    elif run.status in AGENT_STATUSES_WITHOUT_GRADING:
        outcome = Outcome(0.0, run.status, flags=exhausted, evidence={**agent_ev, "diff_bytes": len(diff.encode())})
    elif kind.is_empty(diff) and not cfg.grade_empty_diff:
        outcome = Outcome(0.0, Status.NO_PATCH, flags=exhausted, evidence=agent_ev)
    else:
        t1 = time.monotonic()
        gcfg = (
            cfg.grade if cfg.grade.repo_dir == cfg.repo_dir else dataclasses.replace(cfg.grade, repo_dir=cfg.repo_dir)
        )
        graded = await grade(task, diff, backend, image, gcfg, kind)  # the grade stage's decision
        timings["grade_s"] = time.monotonic() - t1
        outcome = _graded(graded, diff, exhausted, agent_ev)
    return RolloutResult(task.instance_id, harness.name, outcome, diff, run, 1, timings)


def _graded(graded: Outcome, diff: str, exhausted: list[str], agent_ev: dict[str, Any]) -> Outcome:
    """The grader's verdict with the agent stage's evidence and flags; a failing empty diff
    (graded because `grade_empty_diff` asked) is `no_patch`."""
    no_patch = not diff.strip() and graded.status is Status.FAILED
    return Outcome(
        graded.reward,
        Status.NO_PATCH if no_patch else graded.status,
        masked=graded.masked,
        flags=[*graded.flags, *exhausted],
        tests=graded.tests,
        evidence={**graded.evidence, **agent_ev},
    )
