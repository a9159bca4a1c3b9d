"""A harness kept warm beside the sandboxes: one long-lived process per rollout worker.

Some harnesses are libraries whose import costs seconds of CPU per rollout (mini-swe-agent's
LiteLLM, the OpenHands SDK's pydantic models), more than a small task's whole agent loop.
A warm adapter starts the harness once, in its layer's own interpreter (a *driver* script),
and runs each rollout in a thread of it; whatever the agent does in its environment comes
back here as a request and runs in *that rollout's* sandbox, so nothing the agent does
touches the host and the sandbox needs no network (the model calls go from the driver to
the rollout's proxy session over loopback).

`WarmDriver` owns that process and its protocol, one JSON object a line:

    stdout {"op": "ready", ...}                                    once, after the imports
    stdin  {"op": "run", "id": R, ...}                             one rollout (adapter's fields)
    stdout {"op": "exec", "id": R, "n": N, "command", "timeout", "cwd"?, "env"?}
    stdout {"op": "read", "id": R, "n": N, "path"}                 file bytes from the sandbox
    stdout {"op": "write", "id": R, "n": N, "path", "data", "mode"?}  (data: base64)
    stdin  {"op": "result", "n": N, ...}                           the answer to request N
    stdin  {"op": "cancel", "id": R}                               past its time (drivers may ignore it)
    stdout {"op": "done", "id": R, ...}                            the rollout's end

A driver that exits (or never says ready) is `DriverGone`: the rollouts running on it end
as infrastructure errors flagged `warm_driver_died`, with how the driver ended (its exit
status, or the signal that killed it) in their evidence beside the tail of its log; the
worker retries them and the next rollout starts a new driver.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from legorl.harness.base import AgentRun
from legorl.sandbox.base import Sandbox, SandboxError
from legorl.types import Status

READY_TIMEOUT_S = 120.0  # importing the harness on a loaded 2-core machine


DIED_FLAG = "warm_driver_died"


class DriverGone(RuntimeError):
    """The warm driver process exited or never became ready; `exit` says how it ended."""

    def __init__(self, message: str, exit: str = "") -> None:
        super().__init__(message)
        self.exit = exit


def describe_exit(returncode: int | None) -> str:
    """A driver's end in words: `killed by signal 9 (SIGKILL)`, `exited with status 1`."""
    if returncode is None:
        return "still running, its output closed"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-returncode} ({name})"
    return f"exited with status {returncode}"


@dataclass
class WarmRollout:
    """One rollout running in the driver: its sandbox and what its requests cost."""

    sb: Sandbox
    repo_dir: str
    done: asyncio.Future[dict[str, Any]]
    exhausted: bool = False
    sandbox_error: str = ""  # the sandbox died under a request: the rollout decides whose fault
    command_s: float = 0.0  # wall time of its commands in the sandbox
    commands: int = 0
    closed: bool = False


def base_env(home: str) -> dict[str, str]:
    """What every driver runs with: its own HOME and TMPDIR, no proxy for loopback, LiteLLM
    offline (the bundled cost map, no telemetry)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


@dataclass
class WarmDriver:
    """The driver process of one warm adapter, its protocol and the sandbox requests it makes."""

    label: str  # the harness, in messages ("mini-swe-agent", "openhands")
    command: Callable[[], list[str]]  # how to start it (HarnessNotInstalled if its layer is absent)
    env: Callable[[str], dict[str, str]]  # its environment, given its home directory
    recycle_after: int = 0  # rollouts, then a fresh driver once none is running (0: never)
    line_limit: int = 1 << 26  # longest protocol line (a file's bytes travel in one)
    proc: asyncio.subprocess.Process | None = field(default=None, init=False)
    ready: dict[str, Any] = field(default_factory=dict, init=False)  # the driver's "ready" message
    rollouts: dict[str, WarmRollout] = field(default_factory=dict, init=False)
    _reader: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _start_lock: asyncio.Lock | None = field(default=None, init=False, repr=False)
    _home: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)
    in_flight: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)  # requests being served
    _served: int = field(default=0, init=False, repr=False)  # rollouts since the driver started
    _retiring: bool = field(default=False, init=False, repr=False)  # replace it once no rollout runs on it

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the driver (idempotent); returns once it says it is ready."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self.proc is not None and self.proc.returncode is None:
                return
            await self._spawn()

    async def _spawn(self) -> None:
        command = self.command()
        if self._home is None:
            self._home = tempfile.TemporaryDirectory(prefix=f"legorl-{self.label}-")
        home = self._home.name
        log = open(Path(home) / "driver.log", "ab")  # noqa: SIM115 - the child holds its own copy
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=self.env(home),
                cwd=home,
                limit=self.line_limit,
                start_new_session=True,
            )
        finally:
            log.close()
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            line = b""
        msg = json.loads(line) if line.strip() else {}
        if msg.get("op") != "ready":
            proc = self.proc
            await self._stop()
            how = describe_exit(proc.returncode if proc is not None else None)
            raise DriverGone(
                f"{self.label} driver did not start ({how}; see {Path(home) / 'driver.log'}): {self.log_tail()}", how
            )
        self.ready, self._served = msg, 0
        self._reader = asyncio.create_task(self._read(self.proc))

    def log_tail(self, n: int = 800) -> str:
        if self._home is None:
            return ""
        with contextlib.suppress(OSError):
            return (Path(self._home.name) / "driver.log").read_text(errors="replace")[-n:]
        return ""

    async def _stop(self) -> None:
        """End the driver (stdin closed, then killed); the next `start` spawns a new one."""
        proc, reader = self.proc, self._reader
        self.proc = self._reader = None  # at once: a rollout starting meanwhile gets a new driver
        self._served, self._retiring = 0, False
        if proc is not None and proc.stdin is not None and proc.returncode is None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def retire(self) -> None:
        """Replace the driver once no rollout runs on it (now, if none does): the next rollout
        starts a fresh one. For a driver that may be wedged (a rollout ran out its time without
        one model call), without failing the rollouts still running on it."""
        self._retiring = True
        if not self.rollouts:
            await self._stop()

    async def aclose(self) -> None:
        await self._stop()
        if self._home is not None:
            self._home.cleanup()
            self._home = None

    # ---- the protocol -------------------------------------------------------------------

    async def send(self, msg: dict[str, Any]) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            raise DriverGone(f"{self.label} driver is not running")
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        await proc.stdin.drain()

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while raw := await proc.stdout.readline():
                msg = json.loads(raw)
                if msg.get("op") in ("exec", "read", "write"):
                    task = asyncio.create_task(self._serve(msg))
                    self.in_flight.add(task)
                    task.add_done_callback(self.in_flight.discard)
                elif msg.get("op") == "done":
                    r = self.rollouts.get(msg["id"])
                    if r is not None and not r.done.done():
                        r.done.set_result(msg)
        finally:  # the driver is gone: every rollout still running on it ends as ours to retry
            retired = self.proc is not None and self.proc is not proc  # what runs now runs on its successor
            running = [] if retired else [r for r in self.rollouts.values() if not r.done.done()]
            if running:
                with contextlib.suppress(TimeoutError):  # its output closed: its exit follows at once
                    await asyncio.wait_for(asyncio.shield(proc.wait()), 5)
                how = describe_exit(proc.returncode)
                for r in running:
                    if not r.done.done():
                        r.done.set_exception(DriverGone(f"{self.label} driver {how}: {self.log_tail()}", how))

    async def _serve(self, msg: dict[str, Any]) -> None:
        """One request of the driver, run against its rollout's sandbox."""
        r = self.rollouts.get(msg["id"])
        reply: dict[str, Any] = {"op": "result", "n": msg["n"]}
        if r is None or r.closed:
            reply["error"] = "the rollout has ended; its sandbox is closed"
        else:
            try:
                if msg["op"] == "exec":
                    t0 = time.monotonic()
                    res = await r.sb.exec(
                        "exec 2>&1\n" + msg["command"],
                        timeout_s=float(msg["timeout"]),
                        cwd=msg.get("cwd") or r.repo_dir,
                        env=msg.get("env") or None,
                    )
                    reply.update(output=res.stdout, returncode=res.exit_code, timed_out=res.timed_out)
                    r.exhausted = r.exhausted or res.resource_exhausted
                    r.command_s += time.monotonic() - t0
                    r.commands += 1
                elif msg["op"] == "read":
                    reply["data"] = base64.b64encode(await r.sb.read_file(msg["path"])).decode()
                else:
                    data = base64.b64decode(msg["data"])
                    await r.sb.write_file(msg["path"], data, mode=int(msg.get("mode") or 0o644))
            except SandboxError as e:
                r.sandbox_error = str(e)
                reply["error"] = f"sandbox error: {e}"
            except (OSError, ValueError) as e:  # a path the agent named: its observation
                reply["error"] = str(e)
        with contextlib.suppress(DriverGone, OSError):
            await self.send(reply)

    async def run(
        self, job: dict[str, Any], sb: Sandbox, repo_dir: str, timeout_s: float
    ) -> tuple[WarmRollout, dict[str, Any] | None]:
        """Run one rollout (`job`: the adapter's "run" fields) in the driver, its requests in
        `sb`. Returns its bookkeeping and the driver's "done" message, None if it ran past
        `timeout_s` (then it is cancelled). DriverGone if the driver is or goes away;
        SandboxError if the sandbox died under a request (the rollout decides whose fault)."""
        await self.start()
        rid = uuid.uuid4().hex
        r = WarmRollout(sb, repo_dir, asyncio.get_running_loop().create_future())
        self.rollouts[rid] = r
        try:
            await self.send({**job, "op": "run", "id": rid})
            msg: dict[str, Any] | None = await asyncio.wait_for(asyncio.shield(r.done), timeout_s)
        except TimeoutError:
            with contextlib.suppress(DriverGone, OSError):
                await self.send({"op": "cancel", "id": rid})
            msg = None
        finally:
            r.closed = True
            self.rollouts.pop(rid, None)
            self._served += 1
            if self.recycle_after and self._served >= self.recycle_after:
                self._retiring = True  # a long-lived harness process grows a little per rollout: bound it
            if self._retiring and not self.rollouts:
                await self._stop()
        if msg is not None and r.sandbox_error:
            raise SandboxError(r.sandbox_error)
        return r, msg


def unfinished(
    name: str,
    t0: float,
    *,
    gone: DriverGone | None = None,
    r: WarmRollout | None = None,
    timeout_s: float = 0.0,
    log_tail: str = "",
) -> AgentRun:
    """The AgentRun of a warm rollout that did not finish: its driver went away (`gone`,
    infrastructure: retried), or it ran past `timeout_s` (`agent_timeout`: the agent's, with
    the driver's log tail as its output)."""
    if gone is not None:
        return AgentRun(
            -1,
            duration_s=time.monotonic() - t0,
            status=Status.INFRA_ERROR,
            details={"error": str(gone)[-2000:], "harness": name, "flag": DIED_FLAG, "driver_exit": gone.exit},
        )
    return AgentRun(
        124,
        timed_out=True,
        resource_exhausted=r is not None and r.exhausted,
        duration_s=time.monotonic() - t0,
        stderr_tail=log_tail,
        status=Status.AGENT_TIMEOUT,
        details={"error": f"{name} ran past {timeout_s:g} s", "harness": name},
    )
