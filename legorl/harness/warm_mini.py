"""mini-swe-agent, warm: one long-lived harness process, every command in the rollout's sandbox.

The CLI adapter (`mini_swe_agent.py`) starts `mini` inside each agent sandbox: the
harness's Python and LiteLLM imports cost seconds of CPU per rollout, more than a small
task's whole agent loop. This adapter keeps one mini-swe-agent process per rollout worker
(`in_driver/mini_driver/driver.py`, in the harness layer's own venv, started once) and runs each
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
The process and its protocol are `warm.WarmDriver`'s, shared with `openhands-warm`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from legorl.harness.actions import MINI_BASH_TOOL, ActionFormat, mini_format
from legorl.harness.base import API_KEY, MAX_TURNS, AgentRun
from legorl.harness.install import HarnessNotInstalled, require
from legorl.harness.mini_swe_agent import verdict_of_exit
from legorl.harness.warm import DriverGone, WarmDriver, base_env, unfinished
from legorl.sandbox.base import Sandbox
from legorl.types import Status, Task

DRIVER = Path(__file__).resolve().parent / "in_driver" / "mini_driver" / "driver.py"


def _env(home: str) -> dict[str, str]:
    """mini-swe-agent's own settings: configured, quiet, cost tracking off, few retries."""
    return {
        **base_env(home),
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_GLOBAL_CONFIG_DIR": f"{home}/mini-swe-agent",
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",
    }


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
class WarmMiniSweAgent:
    """Adapter: mini-swe-agent 2.4.x in one warm process, commands in the sandboxes."""

    model: str = "legorl-policy"  # sent as `openai/<model>` through LiteLLM
    max_turns: int = MAX_TURNS  # agent.step_limit
    config: str = ""  # mini-swe-agent YAML path; "" = its built-in mini.yaml (what `mini` uses); "quickstart"
    command_timeout_s: int | None = None  # environment.timeout (None: the config's)
    max_output_tokens: int | None = None  # model.model_kwargs.max_tokens (None: the config's)
    name: str = "mini-swe-agent-warm"
    layers: tuple[str, ...] = ()  # nothing is mounted into the sandbox: the harness runs beside it
    # its key to the proxy's TCP port: the worker sets the run's secret before `start` (the
    # default only reaches an open proxy); it stays in the host process, never in a sandbox
    api_key: str = field(default=API_KEY, init=False, repr=False)
    _config_path: str = field(default="", init=False, repr=False)  # resolved once, at start
    _driver: WarmDriver | None = field(default=None, init=False, repr=False)
    readonly_mounts: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    @property
    def action_format(self) -> ActionFormat:
        """What the config's model class reads as an action: `mini.yaml` (the default) a bash
        tool call, a text-based config (the quickstart's) one fenced block of its `action_regex`."""
        if not self.config:
            return MINI_BASH_TOOL
        return mini_format(yaml.safe_load(Path(resolve_config(self.config)).read_text()) or {})

    @property
    def driver(self) -> WarmDriver:
        if self._driver is None:
            self._driver = WarmDriver("mini-swe-agent", lambda: [str(mini_python()), str(DRIVER)], _env)
        return self._driver

    async def start(self) -> None:
        """Start the driver (idempotent); returns once mini-swe-agent is imported."""
        self._config_path = self._config_path or resolve_config(self.config)
        await self.driver.start()

    async def retire(self) -> None:
        """A fresh driver for the next rollout, once none runs on this one."""
        await self.driver.retire()

    async def aclose(self) -> None:
        await self.driver.aclose()

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
        except (HarnessNotInstalled, DriverGone, StopIteration) as e:
            return AgentRun(-1, status=Status.INFRA_ERROR, details={"error": str(e)[-2000:], "harness": self.name})
        job = {
            "config": self._config_path,
            "model": f"openai/{self.model}",
            "api_base": f"{proxy_url.rstrip('/')}/v1",
            "api_key": self.api_key,
            "task": task.problem_statement,
            "cwd": repo_dir,
            "overrides": self._overrides(),
        }
        try:
            r, msg = await self.driver.run(job, sb, repo_dir, timeout_s)
        except DriverGone as e:
            return unfinished(self.name, t0, gone=e)
        if msg is None:  # past its time: the driver was told to cancel it
            return unfinished(self.name, t0, r=r, timeout_s=timeout_s, log_tail=self.driver.log_tail(4000))
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
