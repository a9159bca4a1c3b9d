"""The OpenHands SDK, warm: one long-lived SDK process, every action in the rollout's sandbox.

The in-sandbox adapter (`openhands.py`) starts the SDK inside each agent sandbox, and its
import alone costs ~5 CPU-s per rollout (LiteLLM ~55%, the SDK's and ACP's pydantic
models most of the rest: docs/harnesses.md), more than start-up may take. This adapter
keeps one SDK process per rollout worker (`in_driver/openhands_warm_driver/driver.py`, in the
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
run starts a new driver). The process and its protocol are `warm.WarmDriver`'s, shared
with `mini-swe-agent-warm`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from legorl.harness.actions import TOOL_CALLS, ActionFormat
from legorl.harness.base import API_KEY, MAX_TURNS, AgentRun
from legorl.harness.install import HarnessNotInstalled, require
from legorl.harness.openhands import verdict_of_result
from legorl.harness.warm import DriverGone, WarmDriver, base_env, unfinished
from legorl.sandbox.base import Sandbox
from legorl.types import Status, Task

DRIVER = Path(__file__).resolve().parent / "in_driver" / "openhands_warm_driver" / "driver.py"


def openhands_python() -> Path:
    """The interpreter of the installed openhands layer (HarnessNotInstalled if absent)."""
    py = Path(require("openhands")) / "venv" / "bin" / "python"
    if not py.exists():
        raise HarnessNotInstalled(f"the openhands layer has no {py}; re-run scripts/setup_harnesses.sh")
    return py


def _env(home: str) -> dict[str, str]:
    return {**base_env(home), "OPENHANDS_SUPPRESS_BANNER": "1"}  # TMPDIR: the per-rollout file mirrors


@dataclass
class WarmOpenHands:
    """Adapter: openhands-sdk / openhands-tools 1.58.x in one warm process, actions in the sandboxes."""

    model: str = "legorl-policy"  # sent as `openai/<model>` through LiteLLM
    max_turns: int = MAX_TURNS  # max_iteration_per_run
    condenser_max_size: int = 0  # events before the condenser summarises; 0: the SDK default
    condenser_keep_first: int = 2
    llm_timeout_s: int = 600
    num_retries: int = 2
    command_timeout_s: int = 120  # a terminal command without its own `timeout`
    recycle_after: int = 1000  # rollouts, then a fresh driver once none is running (0: never)
    name: str = "openhands-warm"
    action_format: ClassVar[ActionFormat] = TOOL_CALLS
    layers: tuple[str, ...] = ()  # nothing is mounted into the sandbox: the harness runs beside it
    # its key to the proxy's TCP port: the worker sets the run's secret before `start` (the
    # default only reaches an open proxy); it stays in the host process, never in a sandbox
    api_key: str = field(default=API_KEY, init=False, repr=False)
    _driver: WarmDriver | None = field(default=None, init=False, repr=False)
    readonly_mounts: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    @property
    def driver(self) -> WarmDriver:
        if self._driver is None:  # the SDK process grows by ~0.15 MB a rollout (measured over 40): recycled
            self._driver = WarmDriver("openhands", self.driver_command, _env, recycle_after=self.recycle_after)
        return self._driver

    def driver_command(self) -> list[str]:
        """How the driver is started (a test puts strace in front of it)."""
        return [str(openhands_python()), str(DRIVER)]

    async def start(self) -> None:
        """Start the driver (idempotent); returns once the SDK is imported."""
        await self.driver.start()

    async def retire(self) -> None:
        """A fresh driver for the next rollout, once none runs on this one."""
        await self.driver.retire()

    async def aclose(self) -> None:
        await self.driver.aclose()

    def _argv(self, base_url: str) -> list[str]:
        """The in-sandbox driver's options (`openhands_driver.parser`) for one conversation.
        Free-form values are joined to their option (`--api-key=...`): the run's secret is
        URL-safe base64, and one in 64 begins with "-", which argparse would read as an option."""
        return [
            f"--base-url={base_url}",
            f"--model={self.model}",
            f"--api-key={self.api_key}",
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
        job = {
            "argv": self._argv(f"{proxy_url.rstrip('/')}/v1"),
            "task": task.problem_statement,
            "cwd": repo_dir,
            "command_timeout_s": self.command_timeout_s,
        }
        try:
            r, msg = await self.driver.run(job, sb, repo_dir, timeout_s)
        except DriverGone as e:
            return unfinished(self.name, t0, gone=e)
        if msg is None:  # past its time: the driver was told to cancel it
            return unfinished(self.name, t0, r=r, timeout_s=timeout_s, log_tail=self.driver.log_tail(4000))
        result = msg.get("result") or {}
        verdict = verdict_of_result(result)
        details = {
            **verdict.details,
            "harness": self.name,
            "command_s": f"{r.command_s:.4f}",
            "commands": str(r.commands),
            "driver_import_s": f"{float(self.driver.ready.get('import_s') or 0.0):g}",
        }
        return AgentRun(
            0,
            resource_exhausted=r.exhausted,
            duration_s=time.monotonic() - t0,
            stdout_tail=str(result.get("final") or "")[-4000:],
            status=verdict.status,
            details=details,
        )
