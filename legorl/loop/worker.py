"""A rollout worker: a proxy, a sandbox backend and task images, running rollouts.

One worker is what one machine contributes to a step: `legorl train` runs one in-process;
the Ray backend runs one per actor (each with its own proxy and sandboxes, the engine
reached over HTTP). A rollout is: open a proxy session → serve it on a unix socket that
only that session answers on → run the harness in the agent sandbox with that socket as
its only way out → close the session → grade → assemble the recorded turns into a
trajectory carrying the outcome.

An engine failure during the run is the infrastructure's fault even when the harness
merely reports "API error" and exits: the session's engine-error count turns such a
rollout into `engine_error` (retried, then masked), never into a reward of 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from legorl.engine.base import Engine, HoldsTokenizer
from legorl.harness.base import HostHarness
from legorl.harness.registry import make_harness
from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.models import load_tokenizer
from legorl.proxy.renderers import make_renderer
from legorl.proxy.server import ProxyServer
from legorl.proxy.session_socket import SessionSocket
from legorl.rollout import RolloutResult, run_rollout
from legorl.sandbox import open_backend
from legorl.sandbox.base import SandboxError, SandboxSpec
from legorl.sandbox.images import ImageNotFound
from legorl.sandbox.layers import ImageBuildError
from legorl.tasks.image import TaskImages
from legorl.trajectory import assemble
from legorl.types import Outcome, Status, Task, Trajectory, Turn


@dataclass
class RolloutRecord:
    """What one rollout produced: the trajectory (with outcome) and the raw turns."""

    trajectory: Trajectory
    turns: list[Turn]
    result: RolloutResult
    timings: dict[str, float] = field(default_factory=dict)


OnRecord = Callable[[RolloutRecord], None]


class RolloutBackend(Protocol):
    """Where rollouts run: one in-process worker, or a pool of Ray actors."""

    async def group(
        self,
        task: Task,
        n: int,
        *,
        step: int,
        limit: asyncio.Semaphore,
        on_record: OnRecord | None = None,
        tag: str = "",
    ) -> list[RolloutRecord]: ...


class RolloutWorker:
    """Runs rollouts against one engine; use as an async context manager."""

    def __init__(
        self,
        cfg: RunConfig,
        engine: Engine | None,
        *,
        socket_dir: Path | None = None,
        upstream: str | None = None,
        upstream_api_key: str | None = None,
    ) -> None:
        if (engine is None) == (upstream is None):
            raise ValueError("a rollout worker needs exactly one of an engine or an upstream endpoint")
        self.cfg = cfg
        self.engine = engine
        self.upstream = upstream
        self.upstream_api_key = upstream_api_key
        self.relay: Any = None
        self._tmp = tempfile.TemporaryDirectory(prefix="legorl-sock-") if socket_dir is None else None
        self.socket_dir = Path(self._tmp.name) if self._tmp else socket_dir
        self.proxy: ProxyServer | None = None
        self.backend: Any = None
        self.images = TaskImages(backend=cfg.sandbox.backend)
        self.harness = make_harness(cfg.harness.name, **cfg.harness.harness_options(cfg.proxy.served_model))
        self.retries = cfg.sandbox.retries  # the one owner of infrastructure retries: a fresh sandbox and session each
        self.rollout_cfg = cfg.sandbox.rollout_config()

    async def __aenter__(self) -> RolloutWorker:
        if self.engine is not None:
            tok = (
                self.engine.tokenizer
                if isinstance(self.engine, HoldsTokenizer)
                else load_tokenizer(self.cfg.engine.model)
            )
            self.proxy = ProxyServer(self.cfg.proxy, self.engine, make_renderer(tok), port=0)
            await self.proxy.start()
        else:
            from legorl.proxy.passthrough import PassthroughApp

            self.relay = PassthroughApp(self.upstream or "", self.upstream_api_key, self.cfg.proxy.request_timeout_s)
        self.backend = open_backend(self.cfg.sandbox.backend, self.images.store)
        await self._probe_backend()
        if isinstance(self.harness, HostHarness):
            if self.proxy is None:
                raise ValueError(
                    f"harness {self.harness.name!r} runs beside the sandboxes and needs our proxy; "
                    "it cannot evaluate an external --endpoint (use harness 'mini-swe-agent')"
                )
            try:
                await self.harness.start()
            except RuntimeError as e:  # DriverGone
                raise RunError(f"harness {self.harness.name!r} could not start: {e}") from None
        return self

    async def _probe_backend(self) -> None:
        """One sandbox from the base image, started and closed: a backend that cannot start
        sandboxes at all is the operator's to fix (one message, before any rollout), not
        thousands of masked rollouts."""
        try:
            base = await self.images.base()
            if self.cfg.sandbox.backend == "docker":
                from legorl.sandbox.docker_images import ensure_docker_image

                await ensure_docker_image(self.images.store, base.key)
            async with await self.backend.start(SandboxSpec(image=base.key, workdir="/")) as sb:
                res = await sb.exec("true", timeout_s=30)
            if res.exit_code != 0:
                raise SandboxError(f"`true` exited {res.exit_code}: {res.stderr[-300:]}")
        except (SandboxError, OSError) as e:
            raise RunError(
                f"the {self.cfg.sandbox.backend!r} sandbox backend cannot start a sandbox: {e} "
                "(run `legorl doctor`; scripts/setup_sandbox.sh sets the machine up)"
            ) from None

    async def __aexit__(self, *exc: object) -> None:
        if isinstance(self.harness, HostHarness):
            await self.harness.aclose()
        if self.proxy is not None:
            await self.proxy.stop()
        if self.relay is not None:
            await self.relay.aclose()
        if self.backend is not None:
            await self.backend.aclose()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def rollout(self, task: Task, *, step: int = 0, session_id: str | None = None) -> RolloutRecord:
        """One rollout; an infrastructure fault is retried in a fresh sandbox *and* a fresh
        proxy session, so a failed attempt's turns never join the retried one's trajectory."""
        assert self.backend is not None, "use the worker as `async with RolloutWorker(...)`"
        # A session id names a proxy route: a task name such as Harbor's "org/name" must not split it.
        sid = re.sub(r"[^A-Za-z0-9._-]", "_", session_id or f"{task.instance_id}-{uuid.uuid4().hex[:8]}")
        try:
            image = await self.images.for_task(task)
        except (ValueError, OSError, ImageBuildError, ImageNotFound) as e:  # the task's repository or image
            return self._unbuildable(task, step, sid, e)
        failed: list[str] = []
        for attempt in range(self.retries + 1):
            attempt_sid = sid if attempt == 0 else f"{sid}-retry{attempt}"
            rec = await self._attempt(task, image, step, attempt_sid)
            outcome = rec.trajectory.outcome
            assert outcome is not None
            if not outcome.status.is_infra or attempt == self.retries:
                if failed:
                    outcome.evidence["retried_after"] = failed
                return rec
            failed.append(f"{attempt_sid}: {outcome.evidence.get('cause', outcome.status.value)}")
            await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
        raise AssertionError("unreachable")

    def _unbuildable(self, task: Task, step: int, sid: str, err: Exception) -> RolloutRecord:
        """A task whose image cannot be built (a corrupt bundle, a missing commit, a failing
        env_setup): never the agent's, never rewarded — masked, with the reason; the run goes on."""
        outcome = Outcome(
            0.0,
            Status.INFRA_ERROR,
            masked=True,
            flags=["task_image"],
            evidence={"cause": "task_image", "error": f"{type(err).__name__}: {err}"[-1500:]},
        )
        traj = assemble([], sid)
        traj.instance_id, traj.harness, traj.step, traj.outcome = task.instance_id, self.harness.name, step, outcome
        return RolloutRecord(traj, [], RolloutResult(task.instance_id, self.harness.name, outcome))

    async def _attempt(self, task: Task, image: str, step: int, sid: str) -> RolloutRecord:
        app = self.relay
        session = None
        if self.proxy is not None:
            session = self.proxy.open_session(sid, {"instance_id": task.instance_id, "step": step})
            app = self.proxy.app
        turns: list[Turn] = []
        try:
            if isinstance(self.harness, HostHarness):  # the harness calls the session over loopback
                assert self.proxy is not None
                result = await run_rollout(
                    task,
                    self.harness,
                    self.backend,
                    image,
                    self.rollout_cfg,
                    host_proxy_url=self.proxy.session_url(sid),
                )
            else:  # the harness is in the sandbox: its only way out is this session's socket
                sock = self.socket_dir / f"{uuid.uuid4().hex[:12]}.sock"
                async with SessionSocket(app, sid, sock):
                    result = await run_rollout(
                        task, self.harness, self.backend, image, self.rollout_cfg, proxy_socket=str(sock)
                    )
        finally:
            if self.proxy is not None:
                turns = self.proxy.close_session(sid)
        engine_errors = session.engine_errors if session is not None else 0  # none: an external endpoint, relayed
        outcome = result.outcome
        if engine_errors and not outcome.status.is_infra:
            outcome = Outcome(
                0.0,
                Status.INFRA_ERROR,
                masked=True,
                flags=list(outcome.flags),
                evidence={**outcome.evidence, "cause": "engine_error", "engine_errors": engine_errors},
            )
            result = dataclasses.replace(result, outcome=outcome)
        outcome.evidence.setdefault("diff", result.diff)
        timings = dict(result.timings)
        if result.agent is not None and "command_s" in result.agent.details:  # a HostHarness's commands
            timings["command_s"] = float(result.agent.details["command_s"])
        outcome.evidence.setdefault("timings", {k: round(v, 4) for k, v in timings.items()})
        traj = assemble(turns, sid)
        traj.instance_id, traj.harness, traj.step, traj.outcome = task.instance_id, result.harness, step, outcome
        return RolloutRecord(traj, turns, result, timings)

    async def group(
        self,
        task: Task,
        n: int,
        *,
        step: int,
        limit: asyncio.Semaphore,
        on_record: OnRecord | None = None,
        tag: str = "",
    ) -> list[RolloutRecord]:
        """n rollouts of one task, concurrently (within the shared limit); `on_record` sees
        each one the moment it is graded (the loop writes it to the run store then)."""
        prefix = tag or f"s{step}"

        async def one(k: int) -> RolloutRecord:
            async with limit:
                rec = await self.rollout(
                    task, step=step, session_id=f"{prefix}-{task.instance_id}-{k}-{uuid.uuid4().hex[:6]}"
                )
            if on_record is not None:
                on_record(rec)
            return rec

        return list(await asyncio.gather(*(one(k) for k in range(n))))
