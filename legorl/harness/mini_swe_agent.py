"""mini-swe-agent (`mini`, 2.x) as a harness.

Pointing it at the proxy (docs/harnesses.md): LiteLLM `openai/<model>` with
`model.model_kwargs.api_base` = the session's `/v1`; the built-in `mini.yaml` config first
(`-c` replaces the defaults), then overrides: step limit, working directory, `max_tokens`.
`MSWEA_CONFIGURED` skips the first-run wizard, `MSWEA_COST_TRACKING=ignore_errors` lets
an unknown model through, the LiteLLM price map stays local, and LiteLLM's retries are cut
to 3 (a broken proxy should fail in seconds, not minutes). Non-streaming, one `bash` tool,
every command in a fresh subshell; its replay of the policy's messages is verbatim, and it
never compacts (its history grows until a limit).

Ending (`-o traj.json`, `info.exit_status`; the CLI exits 0 in every case): `Submitted` →
graded; `LimitsExceeded` → `max_turns`; `TimeExceeded` → `agent_timeout`;
`RepeatedFormatError` → `format_error`; `ContextWindowExceededError` → graded; an API or
connection error → `engine_error`; anything else, or no trajectory → `infra_error`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import ClassVar

from legorl.harness.actions import MINI_BASH_TOOL, ActionFormat
from legorl.harness.base import (
    AGENT_DIR,
    API_KEY,
    HOME,
    MAX_TURNS,
    PROBLEM_FILE,
    HarnessVerdict,
    Launch,
    NativeAdapter,
    infra,
)
from legorl.harness.install import require
from legorl.sandbox.base import ExecResult
from legorl.types import Status, Task

TRAJ = f"{AGENT_DIR}/mini_traj.json"
OUT = f"{AGENT_DIR}/mini.out"
_ENGINE = (
    "APIError",
    "APIConnectionError",
    "InternalServerError",
    "ServiceUnavailableError",
    "Timeout",
    "BadRequestError",
    "AuthenticationError",
    "NotFoundError",
    "RateLimitError",
    "PermissionDeniedError",
    "UnsupportedParamsError",
    "BadGatewayError",
)


@dataclass(frozen=True)
class MiniSweAgent(NativeAdapter):
    """Adapter for mini-swe-agent 2.4.x."""

    model: str = "legorl-policy"  # sent as `openai/<model>` through LiteLLM
    max_turns: int = MAX_TURNS  # agent.step_limit
    max_output_tokens: int = 4096  # model.model_kwargs.max_tokens
    command_timeout_s: int = 60  # environment.timeout: one bash command
    name: str = "mini-swe-agent"
    # its built-in mini.yaml: a bash tool call in every turn
    action_format: ClassVar[ActionFormat] = MINI_BASH_TOOL
    layers: tuple[str, ...] = ("python312", "mini-swe-agent")

    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        mini = f"{require('mini-swe-agent')}/venv/bin/mini"
        overrides = [
            "mini.yaml",
            f"model.model_kwargs.api_base={base_url}/v1",
            f"model.model_kwargs.api_key={API_KEY}",
            f"model.model_kwargs.max_tokens={self.max_output_tokens}",
            f"agent.step_limit={self.max_turns}",
            f"environment.cwd={repo_dir}",
            f"environment.timeout={self.command_timeout_s}",
        ]
        args = " ".join(f"-c {shlex.quote(o)}" for o in overrides)
        cmd = (
            f'exec {shlex.quote(mini)} -m {shlex.quote("openai/" + self.model)} -t "$(cat {PROBLEM_FILE})" '
            f"-y --exit-immediately -l 0 {args} -o {TRAJ} < /dev/null > {OUT} 2>&1"
        )
        env = {
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{HOME}/.config/mini-swe-agent",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        return Launch(cmd, env, outputs={"traj": TRAJ, "stdout": OUT}, binary=mini)

    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        tail = outputs.get("stdout", "")[-1500:]
        try:
            traj = json.loads(outputs.get("traj") or "")
        except json.JSONDecodeError:
            return infra(f"mini exited {res.exit_code} without a trajectory; output: {tail}")
        info = traj.get("info") or {}
        exit_status = str(info.get("exit_status") or "")
        stats = info.get("model_stats") or {}
        last = (traj.get("messages") or [{}])[-1]
        error = str((last.get("extra") or {}).get("exception_str") or last.get("content") or tail)[:1500]
        return verdict_of_exit(exit_status, error, {"api_calls": str(stats.get("api_calls", ""))})


def verdict_of_exit(exit_status: str, error: str = "", details: dict[str, str] | None = None) -> HarnessVerdict:
    """How a mini-swe-agent run ended (its `exit_status`), for the CLI and the warm driver alike."""
    details = {"exit_status": exit_status, **(details or {})}
    if exit_status == "Submitted":
        return HarnessVerdict(None, details)
    if exit_status == "LimitsExceeded":
        return HarnessVerdict(Status.MAX_TURNS, details)
    if exit_status == "TimeExceeded":
        return HarnessVerdict(Status.AGENT_TIMEOUT, details)
    if exit_status == "RepeatedFormatError":
        return HarnessVerdict(Status.FORMAT_ERROR, details)
    details["error"] = error[:1500]
    if "ContextWindowExceeded" in exit_status:
        details["context_exhausted"] = "1"
        return HarnessVerdict(None, details)
    if any(e in exit_status for e in _ENGINE):
        return HarnessVerdict(Status.ENGINE_ERROR, details)
    return HarnessVerdict(Status.INFRA_ERROR, details)
