"""A rollout worker: a proxy, a sandbox backend and task images, running rollouts.

One worker is what one machine contributes to a step: `legorl train` runs one in-process;
the Ray backend runs one per actor (each with its own proxy and sandboxes, the engine
reached over HTTP). A rollout is: open a proxy session → serve it on a unix socket that
only that session answers on → run the harness in the agent sandbox with that socket as
its only way out → close the session → grade. Each attempt's decisions (the rollout's
verdict, the recorded turns, the session's engine-error count) become the record — final
outcome and trajectory, built once — in legorl/loop/record.py.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

from legorl.engine.base import Engine, HoldsTokenizer
from legorl.harness.base import HostHarness
from legorl.harness.registry import make_harness
from legorl.http_auth import new_token
from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.loop.record import NO_FIRST_CALL, RolloutAttempt, RolloutRecord, masked_record, record_of
from legorl.models import load_tokenizer
from legorl.proxy.renderer_choice import make_renderer
from legorl.proxy.server import ProxyServer
from legorl.proxy.session_socket import SessionSocket
from legorl.rollout import HostLoopback, ProxyAccess, SandboxSocket, run_rollout
from legorl.sandbox import open_backend
from legorl.sandbox.base import SandboxError, SandboxSpec
from legorl.sandbox.images import ImageNotFound
from legorl.sandbox.layers import ImageBuildError
from legorl.tasks.image import TaskImages
from legorl.types import Outcome, Status, Task, Turn

__all__ = ["OnRecord", "RolloutBackend", "RolloutRecord", "RolloutWorker"]

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
        harness: str | None = None,
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
        opts = cfg.harness.harness_options(cfg.proxy.served_model)
        # one adapter per harness the run uses (a `[harness] mix` has several); the first is the default
        self.harnesses = {name: make_harness(name, **opts) for name in cfg.harness.names()}
        self.harness = next(iter(self.harnesses.values()))
        self.retries = cfg.sandbox.retries  # the one owner of infrastructure retries: a fresh sandbox and session each
        self.rollout_cfg = cfg.sandbox.rollout_config()

    async def __aenter__(self) -> RolloutWorker:
        if self.engine is not None:
            tok = (
                self.engine.tokenizer
                if isinstance(self.engine, HoldsTokenizer)
                else load_tokenizer(self.cfg.engine.model)
            )
            # the per-run secret: only this worker and its host harnesses hold it; a sandbox reaches
            # its session through its own socket (pinned) and never needs it
            self.proxy = ProxyServer(self.cfg.proxy, self.engine, make_renderer(tok), port=0, secret=new_token())
            await self.proxy.start()
        else:
            from legorl.proxy.passthrough import PassthroughApp

            self.relay = PassthroughApp(self.upstream or "", self.upstream_api_key, self.cfg.proxy.request_timeout_s)
        self.backend = open_backend(self.cfg.sandbox.backend, self.images.store)
        await self._probe_backend()
        for harness in self.harnesses.values():
            if not isinstance(harness, HostHarness):
                continue
            if self.proxy is None:
                raise ValueError(
                    f"harness {harness.name!r} runs beside the sandboxes and needs our proxy; "
                    "it cannot evaluate an external --endpoint (use harness 'mini-swe-agent')"
                )
            try:
                await harness.start()
            except RuntimeError as e:  # DriverGone
                raise RunError(f"harness {harness.name!r} could not start: {e}") from None
        return self

    async def _probe_backend(self) -> None:
        """One sandbox from the base image, started and closed: a backend that cannot start
        sandboxes at all is the operator's to fix (one message, before any rollout), not
        thousands of masked rollouts."""
        try:
            base = await self.images.base()
            await self.backend.ensure_image(base.key)
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
        for harness in self.harnesses.values():
            if isinstance(harness, HostHarness):
                await harness.aclose()
        if self.proxy is not None:
            await self.proxy.stop()
        if self.relay is not None:
            await self.relay.aclose()
        if self.backend is not None:
            await self.backend.aclose()
        if self._tmp is not None:
            self._tmp.cleanup()

    async def rollout(
        self, task: Task, *, step: int = 0, session_id: str | None = None, harness: str | None = None
    ) -> RolloutRecord:
        """One rollout in `harness` (default: the run's first); an infrastructure fault is
        retried in a fresh sandbox *and* a fresh proxy session, so a failed attempt's turns
        never join the retried one's trajectory."""
        assert self.backend is not None, "use the worker as `async with RolloutWorker(...)`"
        agent = self.harnesses[harness] if harness else self.harness
        # A session id names a proxy route: a task name such as Harbor's "org/name" must not split it.
        sid = re.sub(r"[^A-Za-z0-9._-]", "_", session_id or f"{task.instance_id}-{uuid.uuid4().hex[:8]}")
        try:
            image = await self.images.for_task(task)
        except (ValueError, OSError, ImageBuildError, ImageNotFound) as e:  # the task's repository or image
            return self._unbuildable(task, step, sid, e, agent.name)
        failed: list[str] = []
        lost = 0  # tokens sampled in the attempts given up on (the token ledger's infra_mask)
        for k in range(self.retries + 1):
            attempt = await self._attempt(task, image, step, sid if k == 0 else f"{sid}-retry{k}", agent)
            cause = attempt.infra_cause
            if cause == NO_FIRST_CALL and isinstance(agent, HostHarness):
                await agent.retire()  # its process may be wedged: the retry and the next rollouts get a new one
            if cause is None or k == self.retries:
                return record_of(task, step, attempt, failed, self.cfg.harness.side_calls, retried_tokens=lost)
            failed.append(f"{attempt.session_id}: {cause}")
            lost += attempt.sampled_tokens
            await asyncio.sleep(min(0.2 * 2**k, 2.0))
        raise AssertionError("unreachable")

    def _unbuildable(self, task: Task, step: int, sid: str, err: Exception, harness: str) -> RolloutRecord:
        """A task whose image cannot be built (a corrupt bundle, a missing commit, a failing
        env_setup): never the agent's, never rewarded — masked, with the reason; the run goes on."""
        outcome = Outcome(
            0.0,
            Status.INFRA_ERROR,
            masked=True,
            flags=["task_image"],
            evidence={"cause": "task_image", "error": f"{type(err).__name__}: {err}"[-1500:]},
        )
        return masked_record(task, step, harness, sid, outcome)

    @asynccontextmanager
    async def _access(self, sid: str, agent: Any) -> AsyncIterator[ProxyAccess]:
        """How the agent of session `sid` reaches it, the one place that is chosen: a host
        harness calls the session's loopback URL with the run's secret as its key (it stays in
        the host process); a harness in the sandbox gets a socket that only this session
        answers on, its only way out, and needs no secret."""
        if isinstance(agent, HostHarness):
            assert self.proxy is not None  # __aenter__ refused a host harness without our proxy
            if hasattr(agent, "api_key"):  # with the session's URL, the run's secret as its key
                agent.api_key = self.proxy.secret
            yield HostLoopback(self.proxy.session_url(sid))
            return
        sock = self.socket_dir / f"{uuid.uuid4().hex[:12]}.sock"
        async with SessionSocket(self.proxy.app if self.proxy is not None else self.relay, sid, sock):
            yield SandboxSocket(str(sock))

    async def _attempt(self, task: Task, image: str, step: int, sid: str, agent: Any) -> RolloutAttempt:
        """One attempt in a fresh proxy session: the rollout's decisions, not yet a record."""
        session = None
        if self.proxy is not None:
            session = self.proxy.open_session(sid, {"instance_id": task.instance_id, "step": step})
        turns: list[Turn] = []
        try:
            async with self._access(sid, agent) as access:
                result = await run_rollout(task, agent, self.backend, image, self.rollout_cfg, access)
        finally:
            if session is not None:
                # closed from outside meanwhile (a management call): its turns are kept, the
                # attempt is ours (retried, then masked), and the run goes on
                turns = session.sorted_turns() if session.closed else self.proxy.close_session(sid)  # type: ignore[union-attr]
        if session is None:  # an external endpoint, relayed: its errors are its own
            return RolloutAttempt(sid, result, turns, 0)
        return RolloutAttempt(
            sid,
            result,
            turns,
            session.engine_errors,
            session.context_errors,
            agent_faults=dict(session.agent_faults),
            closed_externally=session.closed_externally,
            aborted_tokens=sum(len(t.completion_ids) for t in session.aborted),
            requests=session.requests,
        )

    async def group(
        self,
        task: Task,
        n: int,
        *,
        step: int,
        limit: asyncio.Semaphore,
        on_record: OnRecord | None = None,
        tag: str = "",
        harness: str | None = None,
    ) -> list[RolloutRecord]:
        """n rollouts of one task in one harness, concurrently (within the shared limit);
        `on_record` sees each one the moment it is graded (the loop writes it to the run store then)."""
        prefix = tag or f"s{step}"

        async def one(k: int) -> RolloutRecord:
            async with limit:
                rec = await self.rollout(
                    task,
                    step=step,
                    session_id=f"{prefix}-{task.instance_id}-{k}-{uuid.uuid4().hex[:6]}",
                    harness=harness,
                )
            if on_record is not None:
                on_record(rec)
            return rec

        return list(await asyncio.gather(*(one(k) for k in range(n))))
