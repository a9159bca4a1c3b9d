"""mini-swe-agent, warm: one long-lived harness process, every command in the rollout's sandbox.

The CLI adapter (`mini_swe_agent.py`) starts `mini` inside each agent sandbox: the
harness's Python and LiteLLM imports cost seconds of CPU per rollout, more than a small
task's whole agent loop. This adapter keeps one mini-swe-agent process per rollout worker
(`mini_driver/driver.py`, in the harness layer's own venv, started once) and runs each
rollout in a thread of it: mini-swe-agent's own `DefaultAgent`, model class and config,
unmodified, with its documented environment extension point set to
`legorl_sandbox_env.SandboxEnvironment`, which sends every command back here to run with
`/bin/sh` in *that rollout's* sandbox (stdout and stderr merged, killed at the timeout).
So the commands never run on the host, and the sandbox needs no network at all: the
model calls go from the harness process to the rollout's own proxy session over loopback
(`/s/{session}/v1`), and the sandbox holds only the repository and what the agent did.

How a run ends is read from the agent's `exit_status`, as for the CLI
(`mini_swe_agent.verdict_of_exit`); our wall-clock limit → `agent_timeout`; a driver that
died → `infra_error` (the worker retries the rollout; the next run starts a new driver).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from legorl.harness.command import AgentRun
from legorl.harness.install import HarnessNotInstalled, require
from legorl.harness.mini_swe_agent import verdict_of_exit
from legorl.sandbox.base import Sandbox, SandboxError
from legorl.types import Status, Task

DRIVER = Path(__file__).resolve().parent / "mini_driver" / "driver.py"
READY_TIMEOUT_S = 120.0  # importing LiteLLM on a loaded 2-core machine


class DriverGone(RuntimeError):
    """The warm driver process exited or never became ready."""


def mini_python() -> Path:
    """The interpreter of the installed mini-swe-agent layer (HarnessNotInstalled if absent)."""
    py = Path(require("mini-swe-agent")) / "venv" / "bin" / "python"
    if not py.exists():
        raise HarnessNotInstalled(f"the mini-swe-agent layer has no {py}; re-run scripts/setup_harnesses.sh")
    return py


def builtin_config(name: str = "mini.yaml") -> Path:
    """A config file shipped with mini-swe-agent (`minisweagent/config/NAME`)."""
    site = next((Path(require("mini-swe-agent")) / "venv" / "lib").glob("python3*/site-packages"))
    return site / "minisweagent" / "config" / name


NAMED_CONFIGS = {"quickstart": Path(__file__).resolve().parent.parent / "quickstart" / "mini_quickstart.yaml"}


def resolve_config(name: str) -> str:
    """ "" → mini-swe-agent's own mini.yaml; a name of `NAMED_CONFIGS`; else a file path."""
    if not name:
        return str(builtin_config())
    path = NAMED_CONFIGS.get(name, Path(name))
    if not path.is_file():
        raise HarnessNotInstalled(
            f"mini-swe-agent config {name!r} not found (a path, or one of {sorted(NAMED_CONFIGS)})"
        )
    return str(path)


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
class WarmMiniSweAgent:
    """Adapter: mini-swe-agent 2.4.x in one warm process, commands in the sandboxes."""

    model: str = "legorl-policy"  # sent as `openai/<model>` through LiteLLM
    max_turns: int = 30  # agent.step_limit
    config: str = ""  # mini-swe-agent YAML path; "" = its built-in mini.yaml (what `mini` uses); "quickstart"
    command_timeout_s: int | None = None  # environment.timeout (None: the config's)
    max_output_tokens: int | None = None  # model.model_kwargs.max_tokens (None: the config's)
    name: str = "mini-swe-agent-warm"
    layers: tuple[str, ...] = ()  # nothing is mounted into the sandbox: the harness runs beside it
    _proc: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)
    _reader: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _rollouts: dict[str, _Rollout] = field(default_factory=dict, init=False, repr=False)
    _start_lock: asyncio.Lock | None = field(default=None, init=False, repr=False)
    _home: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)
    _config_path: str = field(default="", init=False, repr=False)  # resolved once, at start
    readonly_mounts: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the driver (idempotent); returns once mini-swe-agent is imported."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._proc is not None and self._proc.returncode is None:
                return
            self._config_path = self._config_path or resolve_config(self.config)
            await self._spawn()

    async def _spawn(self) -> None:
        python = mini_python()
        if self._home is None:
            self._home = tempfile.TemporaryDirectory(prefix="legorl-mini-")
        home = self._home.name
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "LANG": "C.UTF-8",
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{home}/mini-swe-agent",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        log = open(Path(home) / "driver.log", "ab")  # noqa: SIM115 - the child holds its own copy
        try:
            self._proc = await asyncio.create_subprocess_exec(
                str(python),
                str(DRIVER),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
                limit=1 << 25,
                start_new_session=True,
            )
        finally:
            log.close()
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if not line or json.loads(line).get("op") != "ready":
            await self._kill()
            raise DriverGone(
                f"mini-swe-agent driver did not start (see {Path(home) / 'driver.log'}): {self.log_tail()}"
            )
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

    async def aclose(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._proc.wait(), 5)
        await self._kill()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._home is not None:
            self._home.cleanup()
            self._home = None

    # ---- the protocol -------------------------------------------------------------------

    async def _send(self, msg: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            raise DriverGone("mini-swe-agent driver is not running")
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        await proc.stdin.drain()

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while raw := await proc.stdout.readline():
                msg = json.loads(raw)
                if msg.get("op") == "exec":
                    task = asyncio.create_task(self._exec(msg))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif msg.get("op") == "done":
                    r = self._rollouts.get(msg["id"])
                    if r is not None and not r.done.done():
                        r.done.set_result(msg)
        finally:  # the driver is gone: every rollout still running ends as ours to retry
            for r in self._rollouts.values():
                if not r.done.done():
                    r.done.set_exception(DriverGone(f"mini-swe-agent driver exited: {self.log_tail()}"))

    async def _exec(self, msg: dict[str, Any]) -> None:
        r = self._rollouts.get(msg["id"])
        reply: dict[str, Any] = {"op": "result", "n": msg["n"]}
        if r is None or r.closed:
            reply["error"] = "the rollout has ended; its sandbox is closed"
        else:
            t0 = time.monotonic()
            try:
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
            except SandboxError as e:
                r.sandbox_error = str(e)
                reply["error"] = f"sandbox error: {e}"
        with contextlib.suppress(DriverGone, OSError):
            await self._send(reply)

    def _overrides(self) -> dict[str, Any]:
        env: dict[str, Any] = {}
        if self.command_timeout_s is not None:
            env["timeout"] = self.command_timeout_s
        model: dict[str, Any] = {}
        if self.max_output_tokens is not None:
            model["model_kwargs"] = {"max_tokens": self.max_output_tokens}
        return {"agent": {"step_limit": self.max_turns}, "environment": env, "model": model}

    async def run(self, sb: Sandbox, task: Task, proxy_url: str | None, repo_dir: str, timeout_s: float) -> AgentRun:
        """One rollout: the agent loop in the driver, its commands in `sb`, its model calls
        to `proxy_url` (the session's host-side URL)."""
        t0 = time.monotonic()
        if not proxy_url:
            return AgentRun(-1, status=Status.INFRA_ERROR, details={"error": "no proxy session for mini-swe-agent"})
        try:
            await self.start()
            config = self._config_path
        except (HarnessNotInstalled, DriverGone, StopIteration) as e:
            return AgentRun(-1, status=Status.INFRA_ERROR, details={"error": str(e)[-2000:], "harness": self.name})
        rid = uuid.uuid4().hex
        r = _Rollout(sb, repo_dir, asyncio.get_running_loop().create_future())
        self._rollouts[rid] = r
        job = {
            "op": "run",
            "id": rid,
            "config": config,
            "model": f"openai/{self.model}",
            "api_base": f"{proxy_url.rstrip('/')}/v1",
            "task": task.problem_statement,
            "cwd": repo_dir,
            "overrides": self._overrides(),
        }
        try:
            await self._send(job)
            msg = await asyncio.wait_for(asyncio.shield(r.done), timeout_s)
        except TimeoutError:
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
        if r.sandbox_error:  # the sandbox died under a command: the rollout decides whose fault
            raise SandboxError(r.sandbox_error)
        verdict = verdict_of_exit(
            str(msg.get("exit_status") or ""),
            str(msg.get("error") or ""),
            {
                "api_calls": str(msg.get("n_calls", "")),
                "harness": self.name,
                "command_s": f"{r.command_s:.4f}",
                "commands": str(r.commands),
            },
        )
        return AgentRun(
            0,
            resource_exhausted=r.exhausted,
            duration_s=time.monotonic() - t0,
            stdout_tail=str(msg.get("submission") or "")[-4000:],
            status=verdict.status,
            details=verdict.details,
        )
