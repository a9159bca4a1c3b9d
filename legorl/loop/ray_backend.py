"""Rollouts on Ray: a step's rollouts spread over worker actors, one machine or many.

Each actor is a whole `RolloutWorker` — its own proxy, sandbox backend and task images —
whose engine is an HTTP client of one shared generation server. `RayRolloutPool` offers
the same `group(task, n, step=, limit=)` as the in-process worker and returns the same
`RolloutRecord`s, so the training loop does not know where rollouts ran.

Where generation happens (`ray_rollout_pool`):
- `[engine] kind = "vllm" | "sglang"`: the actors use that config as is — the server the
  trainer syncs weights to is the one they sample from;
- any in-process engine (`hf`, …): the driver serves its engine object with
  `legorl.engine.serve` (the vLLM completions protocol) and the actors use the `vllm`
  client against it, the same code path as against a GPU vLLM server. Weight sync stays
  in-process on the driver's engine: the server serves that very object.

A remote client cannot see the trainer's weight version, so every rollout carries the
driver engine's `policy_version` to its actor, which stamps it on the turns it records.
Dispatch is least-loaded over the live actors (fewest rollouts in flight, ties to the
lowest index); the step-wide `limit` is held on the driver. Actors need
`[ray] worker_resources`, so a cluster's custom resources decide which nodes run rollouts.
An actor process that dies (OOM, node lost) takes its rollouts in flight with it: each runs
again from the start on a live actor (`lost_rollout_retries`, a new session id ending
`-r<attempt>`), or becomes a masked `infra_error` when none is left. The dead actor gets no
more rollouts until Ray has restarted it (on any node with its resources; a probe call
tells) and its worker is rebuilt. A local cluster, or a cluster addressed on loopback,
binds to 127.0.0.1 only; no usage stats are reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import ray
from ray.exceptions import RayActorError

from legorl.config import ConfigError
from legorl.engine.base import Engine, HoldsTokenizer, records_routing
from legorl.engine.registry import EngineConfig, make_engine
from legorl.loop.config import RayConfig, RunConfig
from legorl.loop.record import RolloutRecord, masked_record
from legorl.loop.worker import OnRecord, RolloutWorker
from legorl.models import load_tokenizer
from legorl.types import Outcome, Status, Task

HTTP_ENGINES = ("vllm", "sglang")


class RolloutActor:
    """One rollout worker inside a Ray actor process (an async actor: rollouts overlap)."""

    def __init__(self, cfg: dict[str, Any], index: int) -> None:
        self.cfg = RunConfig.model_validate(cfg)
        self.index = index
        self.engine: Any = None
        self.worker: RolloutWorker | None = None
        self._lock = asyncio.Lock()

    async def _ensure(self) -> RolloutWorker:
        async with self._lock:
            if self.worker is None:
                self.engine = make_engine(self.cfg.engine, load_tokenizer(self.cfg.engine.model))
                worker = RolloutWorker(self.cfg, self.engine)
                await worker.__aenter__()
                self.worker = worker
        return self.worker

    async def start(self) -> dict[str, Any]:
        await self._ensure()
        return {
            "index": self.index,
            "pid": os.getpid(),
            "node": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    async def rollout(
        self, task: Task, step: int, session_id: str, policy_version: int | None, harness: str | None = None
    ) -> RolloutRecord:
        worker = await self._ensure()
        if policy_version is not None:
            self.engine.policy_version = policy_version
        t0 = time.time()
        rec = await worker.rollout(task, step=step, session_id=session_id, harness=harness)
        rec.timings.update(t_start=t0, t_end=time.time(), worker=float(self.index))
        return rec

    async def stop(self) -> None:
        if self.worker is not None:
            await self.worker.__aexit__(None, None, None)
            await self.engine.close()
            self.worker = None


def init_ray(rc: RayConfig) -> bool:
    """Connect to `rc.address`, or start a local cluster on 127.0.0.1; True if we started it."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no call home from a training run
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": True}
    if rc.address is not None:
        _check_reachable(rc.address)
        host = rc.address.removeprefix("ray://").rpartition(":")[0].strip("[]")
        try:
            with _loopback_only() if host in ("127.0.0.1", "localhost", "::1") else contextlib.nullcontext():
                ray.init(address=rc.address, **kwargs)
        except ConnectionError as e:  # reported like a bad config value: it names the field to fix
            raise ConfigError(f"[ray] address = {rc.address!r}: cannot connect to a Ray cluster there ({e})") from None
        return True
    with _loopback_only():
        ray.init(num_cpus=max(math.ceil(rc.workers * rc.num_cpus_per_worker), 1), **kwargs)
    return True


def _check_reachable(address: str) -> None:
    """Fail in seconds on an address nothing listens at: Ray itself retries for minutes."""
    if address == "auto":
        return  # Ray finds the local cluster itself, or says at once that there is none
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except ValueError:
        raise ConfigError(f"[ray] address = {address!r}: expected 'auto', 'host:port' or 'ray://host:port'") from None
    except OSError as e:
        raise ConfigError(f"[ray] address = {address!r}: nothing answers there ({e}); is the cluster up?") from None


@contextmanager
def _loopback_only() -> Iterator[None]:
    """Make a local cluster listen on 127.0.0.1 only. Ray turns `127.0.0.1` given as the node
    address into the machine's routable IP and binds its servers there (or on 0.0.0.0);
    its single-machine mode (the one macOS/Windows builds use) keeps everything on loopback.
    The switch is read from the environment by the processes Ray starts, and from
    `ray_constants` in this one; both are restored once the cluster is up."""
    key = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    before = os.environ.get(key)
    consts = sys.modules.get("ray._private.ray_constants")
    had = getattr(consts, "ENABLE_RAY_CLUSTER", None)
    os.environ[key] = "0"
    if had is not None:
        consts.ENABLE_RAY_CLUSTER = False  # type: ignore[union-attr]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
        if had is not None:
            consts.ENABLE_RAY_CLUSTER = had  # type: ignore[union-attr]


def client_config(
    engine_cfg: EngineConfig, url: str, *, api_key: str | None, max_context: int | None, routed_experts: bool
) -> EngineConfig:
    """The `vllm` client config that reaches a served in-process engine."""
    return EngineConfig(
        kind="vllm",
        model=engine_cfg.model,
        url=url,
        served_model_name=engine_cfg.served_model_name or engine_cfg.model,
        api_key=api_key,
        stream=True,
        return_routed_experts=routed_experts,
        max_context=max_context,
        max_concurrency=engine_cfg.max_concurrency,
        request_timeout_s=engine_cfg.request_timeout_s,
    )


class RayRolloutPool:
    """`cfg.ray.workers` RolloutActors; `group()` spreads rollouts over them (async context manager)."""

    def __init__(
        self,
        cfg: RunConfig,
        engine_url: str | None = None,
        *,
        engine_cfg: EngineConfig | None = None,
        policy_version: Callable[[], int] | None = None,
    ) -> None:
        if engine_cfg is None:
            if engine_url is None:
                raise ValueError("RayRolloutPool needs an engine_url or an engine_cfg for its workers")
            engine_cfg = client_config(
                cfg.engine, engine_url, api_key=None, max_context=cfg.engine.max_context, routed_experts=False
            )
        self.cfg = cfg
        self.worker_cfg = cfg.model_copy(update={"engine": engine_cfg})
        self.policy_version = policy_version
        self.actors: list[Any] = []
        self.inflight: list[int] = []
        self.info: list[dict[str, Any]] = []
        self.lost: set[int] = set()  # actors whose process died and that Ray has not restarted yet
        self.lost_rollouts = 0  # attempts lost with their actor (retried or masked)
        self._probes: dict[int, asyncio.Task[None]] = {}
        self._owns_ray = False

    async def __aenter__(self) -> RayRolloutPool:
        self._owns_ray = init_ray(self.cfg.ray)
        try:
            actor_cls = ray.remote(RolloutActor).options(
                num_cpus=self.cfg.ray.num_cpus_per_worker,
                resources=dict(self.cfg.ray.worker_resources) or None,
                max_restarts=2,
                max_task_retries=0,
                max_concurrency=1000,
            )
            raw = self.worker_cfg.model_dump(mode="json")
            self.actors = [actor_cls.remote(raw, i) for i in range(self.cfg.ray.workers)]
            self.inflight = [0] * len(self.actors)
            self.info = list(await asyncio.gather(*(a.start.remote() for a in self.actors)))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    @property
    def placement(self) -> dict[str, Any]:
        """Where the driver (trainer, served engine) and each worker actor run."""
        nodes = {
            n["NodeID"]: {k: v for k, v in n["Resources"].items() if not k.startswith("node:")}
            for n in ray.nodes()
            if n["Alive"]
        }
        return {
            "driver_node_id": ray.get_runtime_context().get_node_id(),
            "workers": list(self.info),
            "nodes": nodes,
            "lost": sorted(self.lost),
            "lost_rollouts": self.lost_rollouts,
        }

    async def __aexit__(self, *exc: object) -> None:
        for t in self._probes.values():
            t.cancel()
        await asyncio.gather(*self._probes.values(), return_exceptions=True)
        if self.actors:  # a lost actor has nothing to stop (a call would wait for its restart)
            stops = [a.stop.remote() for i, a in enumerate(self.actors) if i not in self.lost]
            done, _ = await asyncio.wait([asyncio.ensure_future(s) for s in stops], timeout=60)
            for d in done:
                d.exception()  # a worker that died while stopping has nothing left to close
            for a in self.actors:
                ray.kill(a)
            self.actors = []
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    async def rollout(self, task: Task, *, step: int = 0, session_id: str | None = None) -> RolloutRecord:
        """One rollout on the least-loaded actor."""
        return await self._run(task, step, session_id=session_id, prefix=task.instance_id)

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
        """n rollouts of one task, spread over the actors (within the shared limit); `on_record`
        sees each one as it comes back graded."""

        async def one(k: int) -> RolloutRecord:
            async with limit:
                rec = await self._run(
                    task, step, session_id=None, prefix=f"{tag or f's{step}'}-{task.instance_id}-{k}", harness=harness
                )
            if on_record is not None:
                on_record(rec)
            return rec

        return list(await asyncio.gather(*(one(k) for k in range(n))))

    async def _run(
        self, task: Task, step: int, *, session_id: str | None, prefix: str, harness: str | None = None
    ) -> RolloutRecord:
        err: Exception | None = None
        sid = session_id or f"{prefix}-lost-{uuid.uuid4().hex[:6]}"
        for attempt in range(self.cfg.ray.lost_rollout_retries + 1):
            live = [j for j in range(len(self.actors)) if j not in self.lost]
            if not live:
                break
            i = min(live, key=lambda j: (self.inflight[j], j))
            retry = f"-r{attempt}" if attempt else ""
            sid = session_id or f"{prefix}-w{i}-{uuid.uuid4().hex[:6]}{retry}"  # the session id names its worker
            version = self.policy_version() if self.policy_version is not None else None
            self.inflight[i] += 1
            try:
                return await self.actors[i].rollout.remote(task, step, sid, version, harness)
            except RayActorError as e:
                err = e
                self.lost_rollouts += 1
                self._mark_lost(i)
            finally:
                self.inflight[i] -= 1
        return self._lost(task, step, sid, err or RuntimeError("no live rollout worker"), harness)

    def _mark_lost(self, i: int) -> None:
        """Take actor i out of dispatch until a probe call reaches its restarted process."""
        if i in self.lost:
            return
        self.lost.add(i)

        async def probe() -> None:
            try:
                self.info[i] = await self.actors[i].start.remote()  # waits for Ray's restart
            except RayActorError:
                return  # restarts used up: it stays out
            self.lost.discard(i)
            self._probes.pop(i, None)

        self._probes[i] = asyncio.create_task(probe())

    def _lost(self, task: Task, step: int, sid: str, err: Exception, harness: str | None = None) -> RolloutRecord:
        """A rollout whose worker process died: an infrastructure fault, masked."""
        outcome = Outcome(
            0.0, Status.INFRA_ERROR, masked=True, evidence={"cause": "rollout_worker_died", "error": str(err)[-500:]}
        )
        return masked_record(task, step, harness or self.cfg.harness.names()[0], sid, outcome)


@asynccontextmanager
async def ray_rollout_pool(cfg: RunConfig, engine: Engine) -> AsyncIterator[RayRolloutPool]:
    """The Ray backend for `legorl train`: serve `engine` if it is in-process, then the pool."""

    def version() -> int:
        return int(engine.policy_version)

    if cfg.engine.kind in HTTP_ENGINES:
        async with RayRolloutPool(cfg, engine_cfg=cfg.engine, policy_version=version) as pool:
            yield pool
        return
    from legorl.engine.serve import EngineServer

    owns = init_ray(cfg.ray)  # first: the served engine binds the address of the driver's own node
    try:
        host = ray.util.get_node_ip_address()  # 127.0.0.1 for a local or loopback cluster
        key = secrets.token_hex(16)  # the served engine answers only our workers
        tokenizer = engine.tokenizer if isinstance(engine, HoldsTokenizer) else load_tokenizer(cfg.engine.model)
        name = cfg.engine.served_model_name or cfg.engine.model
        async with EngineServer(engine, tokenizer, name, host=host, port=0, api_key=key) as srv:
            client = client_config(
                cfg.engine,
                f"http://{host}:{srv.port}",
                api_key=key,
                max_context=engine.max_context,
                routed_experts=records_routing(engine),
            )
            async with RayRolloutPool(cfg, engine_cfg=client, policy_version=version) as pool:
                yield pool
    finally:
        if owns:
            ray.shutdown()
