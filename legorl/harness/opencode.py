"""OpenCode (`opencode run`, the npm package's native binary) as a harness.

Pointing it at the proxy (docs/harnesses.md): a custom provider through the bundled
`@ai-sdk/openai-compatible` adapter, `baseURL` = the session's `/v1`, written to a config
file named by `OPENCODE_CONFIG`. The model entry's `limit.context` drives OpenCode's
auto-compaction (set it below the proxy's window to force a compaction in a test) and
`limit.output` becomes `max_tokens`. `agent.build.steps` is the step limit: on the last
step OpenCode appends a "maximum steps reached" assistant prefill and expects text.
Everything is allowed (`permission: *: allow`, `--auto`), since `run` auto-rejects asks.
`--title` suppresses the title-generation side call. Off: the model catalogue fetch,
auto-update, sharing, LSP downloads and the per-step git snapshots of the work tree
(an undo feature that never reaches the prompt).

The prompt goes on stdin (a positional message with spaces arrives wrapped in quotes).
The model id picks OpenCode's system prompt by substring (`claude`, `gpt`, `gemini`, …);
anything else gets the default prompt. Keep it fixed per experiment.

Ending (`--format json` events): a normal end → graded, unless it used all its steps →
`max_turns`; an `error` event with an API error the policy cannot cause (5xx, connection)
→ `engine_error`, another 4xx → `infra_error`; `ContextOverflowError` it could not compact
out of → graded; no events at all → the binary did not start → `infra_error`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import ClassVar

from legorl.harness.actions import TOOL_CALLS, ActionFormat
from legorl.harness.base import (
    AGENT_DIR,
    API_KEY,
    HOME,
    MAX_TURNS,
    PROBLEM_FILE,
    HarnessVerdict,
    Launch,
    NativeAdapter,
    http_status_is_infra,
    infra,
    jsonl,
)
from legorl.harness.install import require
from legorl.sandbox.base import ExecResult
from legorl.types import Status, Task

CONFIG = f"{AGENT_DIR}/opencode.json"
CONFIG_DIR = f"{HOME}/.config/opencode"
# OpenCode `npm install`s its plugin SDK into every config directory in the background at
# start-up (a registry lookup that cannot succeed offline) unless the directory's lockfile
# already lists it beside a node_modules directory: so it does.
PLUGIN_LOCK = json.dumps({"lockfileVersion": 3, "packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}})
OUT = f"{AGENT_DIR}/opencode.jsonl"
ERR = f"{AGENT_DIR}/opencode.err"
PROVIDER = "legorl"


@dataclass(frozen=True)
class OpenCode(NativeAdapter):
    """Adapter for OpenCode 1.18.x."""

    model: str = "legorl-policy"  # model id inside the provider (picks OpenCode's prompt: keep it fixed)
    max_turns: int = MAX_TURNS  # agent.build.steps
    max_output_tokens: int = 4096  # limit.output -> max_tokens
    context_window: int = 32768  # limit.context: OpenCode compacts when usage nears it
    title: str = "legorl task"  # --title: no title-generation side call
    name: str = "opencode"
    action_format: ClassVar[ActionFormat] = TOOL_CALLS
    layers: tuple[str, ...] = ("opencode",)

    def config(self, base_url: str) -> dict:
        model = {
            "name": self.model,
            "tool_call": True,
            "limit": {"context": self.context_window, "output": self.max_output_tokens},
        }
        return {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "LEGO-RL proxy",
                    "options": {"baseURL": f"{base_url}/v1", "apiKey": API_KEY},
                    "models": {self.model: model},
                }
            },
            "model": f"{PROVIDER}/{self.model}",
            "small_model": f"{PROVIDER}/{self.model}",
            "autoupdate": False,
            "share": "disabled",
            "snapshot": False,
            "permission": {"*": "allow"},
            "agent": {"build": {"steps": self.max_turns}},
            "compaction": {"auto": True},
        }

    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        binary = f"{require('opencode')}/bin/opencode"
        env = {
            "OPENCODE_CONFIG": CONFIG,
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        }
        cmd = (
            f"exec {shlex.quote(binary)} run --format json --auto --title {shlex.quote(self.title)} "
            f"--model {PROVIDER}/{shlex.quote(self.model)} --dir {shlex.quote(repo_dir)} "
            f"< {PROBLEM_FILE} > {OUT} 2> {ERR}"
        )
        files = {
            CONFIG: json.dumps(self.config(base_url), indent=1).encode(),
            f"{CONFIG_DIR}/package-lock.json": PLUGIN_LOCK.encode(),
            f"{CONFIG_DIR}/node_modules/.legorl": b"",
        }
        return Launch(cmd, env, files, outputs={"events": OUT, "stderr": ERR}, binary=binary)

    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        events = jsonl(outputs.get("events", ""))
        err_tail = outputs.get("stderr", "")[-1500:]
        steps = sum(1 for e in events if e.get("type") == "step_start")
        errors = [e.get("error") or {} for e in events if e.get("type") == "error"]
        details = {"steps": str(steps), "errors": str(len(errors))}
        if not events:
            return infra(f"opencode exited {res.exit_code} without any event; stderr: {err_tail}")
        if errors:
            err = errors[-1]
            name = str(err.get("name", ""))
            data = err.get("data") or {}
            details["error"] = (str(data.get("message") or err.get("message") or name))[:1500]
            if name == "ContextOverflowError":
                details["context_exhausted"] = "1"
                return HarnessVerdict(None, details)
            if name == "APIError" or "statusCode" in data:
                code = data.get("statusCode")
                infra_fault = http_status_is_infra(code if isinstance(code, int) else None)
                return HarnessVerdict(Status.ENGINE_ERROR if infra_fault else Status.INFRA_ERROR, details)
            return HarnessVerdict(Status.INFRA_ERROR, details)
        if res.exit_code != 0:
            return infra(f"opencode exited {res.exit_code}; stderr: {err_tail}")
        if steps >= self.max_turns:
            return HarnessVerdict(Status.MAX_TURNS, details)
        return HarnessVerdict(None, details)
