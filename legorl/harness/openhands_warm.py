"""The OpenHands SDK, warm: one long-lived SDK process, every action in the rollout's sandbox.

The in-sandbox adapter (`openhands.py`) starts the SDK inside each agent sandbox, and its
import alone costs ~5 CPU-s per rollout (LiteLLM ~55%, the SDK's and ACP's pydantic
models most of the rest: docs/harnesses.md), more than start-up may take. This adapter
keeps one SDK process per rollout worker (`openhands_warm_driver/driver.py`, in the
openhands layer's own venv, started once) and runs each rollout's conversation in a thread
of it: the same agent, condenser and limits as the in-sandbox adapter
(`openhands_driver.run`), with the SDK's own terminal and file-editor definitions whose
executors (registered through the SDK's `register_tool`) send every command, file read and
file write back here, to run in *that rollout's* sandbox (`sandbox_tools.py`). So nothing
the agent does happens on the host, and the sandbox needs no network at all: the model
calls go from the SDK process to the rollout's proxy session over loopback
(`/s/{session}/v1`).

How a run ends is read from the same result JSON as the in-sandbox adapter
(`openhands.verdict_of_result`); our wall-clock limit → `agent_timeout` (the conversation
is paused); a driver that died → `infra_error` (the worker retries the rollout; the next
run starts a new driver).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from legorl.harness.base import API_KEY
from legorl.harness.command import AgentRun
from legorl.harness.install import HarnessNotInstalled, require
from legorl.harness.openhands import verdict_of_result
from legorl.harness.warm_mini import READY_TIMEOUT_S, DriverGone
from legorl.sandbox.base import Sandbox, SandboxError
from legorl.types import Status, Task

DRIVER = Path(__file__).resolve().parent / "openhands_warm_driver" / "driver.py"


def openhands_python() -> Path:
    """The interpreter of the installed openhands layer (HarnessNotInstalled if absent)."""
    py = Path(require("openhands")) / "venv" / "bin" / "python"
    if not py.exists():
        raise HarnessNotInstalled(f"the openhands layer has no {py}; re-run scripts/setup_harnesses.sh")
    return py


@dataclass
class _Rollout:
    sb: Sandbox
    repo_dir: str
    done: asyncio.Future[dict[str, Any]]
    exhausted: bool = False
    sandbox_error: str = ""
    command_s: float = 0.0  # wall time of its commands in the sandbox
    commands: int = 0
    closed: bool = False


@dataclass
class WarmOpenHands:
    """Adapter: openhands-sdk / openhands-tools 1.58.x in one warm process, actions in the sandboxes."""

    model: str = "legorl-policy"  # sent as `openai/<model>` through LiteLLM
    max_turns: int = 30  # max_iteration_per_run
    condenser_max_size: int = 0  # events before the condenser summarises; 0: the SDK default
    condenser_keep_first: int = 2
    llm_timeout_s: int = 600
    num_retries: int = 2
    command_timeout_s: int = 120  # a terminal command without its own `timeout`
    recycle_after: int = 1000  # rollouts, then a fresh driver once none is running (0: never)
    name: str = "openhands-warm"
    layers: tuple[str, ...] = ()  # nothing is mounted into the sandbox: the harness runs beside it
    _proc: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)
    _reader: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _rollouts: dict[str, _Rollout] = field(default_factory=dict, init=False, repr=False)
    _start_lock: asyncio.Lock | None = field(default=None, init=False, repr=False)
    _home: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)
    import_s: float = field(default=0.0, init=False, repr=False)  # the driver's one-off SDK import
    _served: int = field(default=0, init=False, repr=False)  # rollouts since the driver started
    readonly_mounts: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the driver (idempotent); returns once the SDK is imported."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._proc is not None and self._proc.returncode is None:
                return
            await self._spawn()

    def driver_command(self) -> list[str]:
        """How the driver is started (a test puts strace in front of it)."""
        return [str(openhands_python()), str(DRIVER)]

    async def _spawn(self) -> None:
        command = self.driver_command()
        if self._home is None:
            self._home = tempfile.TemporaryDirectory(prefix="legorl-openhands-")
        home = self._home.name
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "LANG": "C.UTF-8",
            "TMPDIR": home,  # the per-rollout file mirrors live here, and go with it
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        log = open(Path(home) / "driver.log", "ab")  # noqa: SIM115 - the child holds its own copy
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=home,
                limit=1 << 26,
                start_new_session=True,
            )
        finally:
            log.close()
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            line = b""
        msg = json.loads(line) if line.strip() else {}
        if msg.get("op") != "ready":
            await self._kill()
            raise DriverGone(f"openhands driver did not start (see {Path(home) / 'driver.log'}): {self.log_tail()}")
        self.import_s = float(msg.get("import_s") or 0.0)
        self._served = 0
        self._reader = asyncio.create_task(self._read(self._proc))

    def log_tail(self, n: int = 800) -> str:
        if self._home is None:
            return ""
        with contextlib.suppress(OSError):
            return (Path(self._home.name) / "driver.log").read_text(errors="replace")[-n:]
        return ""

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()

    async def _stop(self) -> None:
        """End the driver (stdin closed, then killed); the next `start` spawns a new one."""
        proc, reader = self._proc, self._reader
        self._proc = self._reader = None  # at once: a rollout starting meanwhile gets a new driver
        if proc is not None and proc.stdin is not None:
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

    async def aclose(self) -> None:
        await self._stop()
        if self._home is not None:
            self._home.cleanup()
            self._home = None

    # ---- the protocol -------------------------------------------------------------------

    async def _send(self, msg: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            raise DriverGone("openhands driver is not running")
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        await proc.stdin.drain()

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while raw := await proc.stdout.readline():
                msg = json.loads(raw)
                if msg.get("op") in ("exec", "read", "write"):
                    task = asyncio.create_task(self._serve(msg))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif msg.get("op") == "done":
                    r = self._rollouts.get(msg["id"])
                    if r is not None and not r.done.done():
                        r.done.set_result(msg.get("result") or {})
        finally:  # the driver is gone: every rollout still running on it ends as ours to retry
            retired = self._proc is not None and self._proc is not proc  # what runs now runs on its successor
            for r in () if retired else self._rollouts.values():
                if not r.done.done():
                    r.done.set_exception(DriverGone(f"openhands driver exited: {self.log_tail()}"))

    async def _serve(self, msg: dict[str, Any]) -> None:
        """One request of a tool executor, run against its rollout's sandbox."""
        r = self._rollouts.get(msg["id"])
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
            await self._send(reply)

    def _argv(self, base_url: str) -> list[str]:
        """The in-sandbox driver's options (`openhands_driver.parser`) for one conversation."""
        return [
            "--base-url",
            base_url,
            "--model",
            self.model,
            "--api-key",
            API_KEY,
            "--workspace",
            "/",  # replaced by the rollout's mirror in the warm driver
            "--prompt-file",
            "-",
            "--out",
            "-",
            "--max-iterations",
            str(self.max_turns),
            "--condenser-max-size",
            str(self.condenser_max_size),
            "--condenser-keep-first",
            str(self.condenser_keep_first),
            "--timeout-s",
            str(self.llm_timeout_s),
            "--num-retries",
            str(self.num_retries),
        ]

    async def run(self, sb: Sandbox, task: Task, proxy_url: str | None, repo_dir: str, timeout_s: float) -> AgentRun:
        """One rollout: the conversation in the driver, its actions in `sb`, its model calls
        to `proxy_url` (the session's host-side URL)."""
        t0 = time.monotonic()
        if not proxy_url:
            return AgentRun(-1, status=Status.INFRA_ERROR, details={"error": "no proxy session for openhands-warm"})
        try:
            await self.start()
        except (HarnessNotInstalled, DriverGone) as e:
            return AgentRun(-1, status=Status.INFRA_ERROR, details={"error": str(e)[-2000:], "harness": self.name})
        rid = uuid.uuid4().hex
        r = _Rollout(sb, repo_dir, asyncio.get_running_loop().create_future())
        self._rollouts[rid] = r
        job = {
            "op": "run",
            "id": rid,
            "argv": self._argv(f"{proxy_url.rstrip('/')}/v1"),
            "task": task.problem_statement,
            "cwd": repo_dir,
            "command_timeout_s": self.command_timeout_s,
        }
        try:
            await self._send(job)
            result = await asyncio.wait_for(asyncio.shield(r.done), timeout_s)
        except TimeoutError:
            with contextlib.suppress(DriverGone, OSError):
                await self._send({"op": "cancel", "id": rid})
            return AgentRun(
                124,
                timed_out=True,
                resource_exhausted=r.exhausted,
                duration_s=time.monotonic() - t0,
                status=Status.AGENT_TIMEOUT,
                details={"error": f"{self.name} ran past {timeout_s:g} s", "harness": self.name},
            )
        except DriverGone as e:
            return AgentRun(
                -1,
                duration_s=time.monotonic() - t0,
                status=Status.INFRA_ERROR,
                details={"error": str(e)[-2000:], "harness": self.name},
            )
        finally:
            r.closed = True
            self._rollouts.pop(rid, None)
            self._served += 1
            if self.recycle_after and self._served >= self.recycle_after and not self._rollouts:
                # The SDK process grows by ~0.15 MB a rollout (measured over 40): bound it
                self._served = 0
                await self._stop()
        if r.sandbox_error:  # the sandbox died under a command: the rollout decides whose fault
            raise SandboxError(r.sandbox_error)
        verdict = verdict_of_result(result)
        details = {
            **verdict.details,
            "harness": self.name,
            "command_s": f"{r.command_s:.4f}",
            "commands": str(r.commands),
            "driver_import_s": f"{self.import_s:g}",
        }
        return AgentRun(
            0,
            resource_exhausted=r.exhausted,
            duration_s=time.monotonic() - t0,
            stdout_tail=str(result.get("final") or "")[-4000:],
            status=verdict.status,
            details=details,
        )
