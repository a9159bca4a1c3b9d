"""The OpenHands Software Agent SDK as a harness (driven by `in_sandbox/openhands_driver.py`).

The SDK is a Python library (Python >= 3.12, in its own venv layer), so its "command
line" is a small driver script this adapter writes into the sandbox and runs with the
layer's interpreter: the SDK's standard agent (terminal, file editor, task tracker, the
built-in `finish` and `think`, the default summarising condenser) on a LiteLLM `openai/`
model whose `base_url` is the session's `/v1` (docs/harnesses.md). Calls are
non-streaming, carry `reasoning_effort` and list-of-parts content; tool arguments come back
re-serialised by `json.dumps`, and reasoning is dropped from history — the proxy splices
what was sampled where it can, and a dropped reasoning block starts a new segment.

The terminal tool runs commands in a subprocess-backed shell (`terminal_type=subprocess`):
the SDK's tmux backend would need a tmux binary inside every task image for no change in
what the model sees. `condenser_max_size` (events) forces a condensation in tests; 0 keeps
the SDK's default condenser.

Ending (the driver's result.json): `finished` → graded; `error` with `MaxIterationsReached`
→ `max_turns`; `stuck` (the SDK's loop detector) → graded; an LLM error the policy cannot
cause (connection, 5xx, a rejected request) → `engine_error`; a context-window error →
graded; the driver crashed or wrote nothing → `infra_error`. `openhands_warm.py` runs the
same agent in one warm process beside the sandboxes (`verdict_of_result` reads both).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from legorl.harness.actions import TOOL_CALLS, ActionFormat
from legorl.harness.base import (
    AGENT_DIR,
    API_KEY,
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

DRIVER_SOURCE = Path(__file__).parent / "in_sandbox" / "openhands_driver.py"  # copied in, never imported
DRIVER = f"{AGENT_DIR}/openhands_driver.py"
RESULT = f"{AGENT_DIR}/openhands_result.json"
OUT = f"{AGENT_DIR}/openhands.out"
ERR = f"{AGENT_DIR}/openhands.err"
# LiteLLM exception names that mean the model endpoint (our proxy/engine) failed.
_INFRA_ERRORS = (
    "APIConnectionError",
    "InternalServerError",
    "ServiceUnavailable",
    "BadGateway",
    "Timeout",
    "AuthenticationError",
    "NotFoundError",
    "BadRequestError",
    "APIError",
    "RateLimit",
    "LLMNoResponse",
    "LLMBadRequest",
    "LLMAuthentication",
    "LLMServiceUnavailable",
)
_CONTEXT_ERRORS = ("ContextWindowExceeded", "LLMContextWindowExceed", "context length", "context window")


@dataclass(frozen=True)
class OpenHands(NativeAdapter):
    """Adapter for openhands-sdk / openhands-tools 1.58.x."""

    model: str = "legorl-policy"  # sent as `openai/<model>` through LiteLLM
    max_turns: int = MAX_TURNS  # max_iteration_per_run
    condenser_max_size: int = 0  # events before the condenser summarises; 0: the SDK default
    condenser_keep_first: int = 2
    llm_timeout_s: int = 600
    num_retries: int = 2
    name: str = "openhands"
    action_format: ClassVar[ActionFormat] = TOOL_CALLS
    layers: tuple[str, ...] = ("python312", "openhands")

    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        python = f"{require('openhands')}/venv/bin/python"
        args = [
            python,
            DRIVER,
            "--base-url",
            f"{base_url}/v1",
            "--model",
            self.model,
            "--api-key",
            API_KEY,
            "--workspace",
            repo_dir,
            "--prompt-file",
            PROBLEM_FILE,
            "--out",
            RESULT,
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
        env = {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        cmd = "exec " + " ".join(shlex.quote(a) for a in args) + f" > {OUT} 2> {ERR}"
        files = {DRIVER: DRIVER_SOURCE.read_bytes()}
        return Launch(cmd, env, files, outputs={"result": RESULT, "stdout": OUT, "stderr": ERR}, binary=python)

    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        err_tail = outputs.get("stderr", "")[-1500:]
        try:
            r = json.loads(outputs.get("result") or "")
        except json.JSONDecodeError:
            return infra(f"openhands driver exited {res.exit_code} without a result; stderr: {err_tail}")
        return verdict_of_result(r)


def verdict_of_result(r: dict) -> HarnessVerdict:
    """How a conversation ended (the driver's result JSON, in the sandbox or warm) → HarnessVerdict."""
    status = str(r.get("status", ""))
    code = str(r.get("error_code") or "")
    error = str(r.get("error") or "")
    details = {
        "status": status,
        "actions": str(r.get("actions", "")),
        "condensations": str(r.get("condensations", "")),
    }
    for k, v in (r.get("startup") or {}).items():  # the driver's start-up phases (import, setup)
        details[f"startup_{k}"] = str(v)
    if code:
        details["error_code"] = code
    if error:
        details["error"] = error[:1500]
    if status == "crashed":
        details["error"] = (error + "\n" + str(r.get("traceback", ""))[-1000:])[:2500]
        return HarnessVerdict(Status.INFRA_ERROR, details)
    if code == "MaxIterationsReached":
        return HarnessVerdict(Status.MAX_TURNS, details)
    if status in ("finished", "stuck") and not code:
        return HarnessVerdict(None, details)
    blob = f"{code} {error}"
    if any(s in blob for s in _CONTEXT_ERRORS):
        details["context_exhausted"] = "1"
        return HarnessVerdict(None, details)
    if any(s in blob for s in _INFRA_ERRORS):
        return HarnessVerdict(Status.ENGINE_ERROR, details)
    if status == "error":
        return HarnessVerdict(Status.INFRA_ERROR, details)
    return HarnessVerdict(None, details)
