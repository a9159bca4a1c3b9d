"""Qwen Code (`@qwen-code/qwen-code` 0.24.x, a Gemini CLI fork on Node.js >= 22) as a harness.

Pointing it at the proxy: OpenAI Chat Completions through its `openai` auth type, the
session's `/v1` as `--openai-base-url`, any `--openai-api-key`, `--model` the
harness-side model name. Headless: the prompt on stdin, `--yolo` (every tool approved),
`--output-format stream-json` (Claude-Code-like events), `--max-session-turns`,
`--chat-recording false`, run in the repository. Its tools (run_shell_command,
read_file, edit, write_file, glob, grep_search, todo_write, ...) run in the sandbox.

Off, through its own settings (`$HOME/.qwen/settings.json`, the keys it shares with Gemini
CLI: `gemini_cli.quiet_settings`) and environment: usage statistics and telemetry,
auto-update, IDE integration, folder trust, checkpointing, the downloaded ripgrep, the
interactive shell, loop-detection and next-speaker side calls, sub-agents, the relaunch
into a child process (`QWEN_CODE_NO_RELAUNCH`) and its own sandbox.

Compaction: Qwen Code compresses its history (a summary call) when the prompt nears
`compression_threshold` × `context_window` (`model.chatCompression.contextPercentageThreshold`,
`model.generationConfig.contextWindowSize`); set the window below the proxy's to force one.

Ending (the final `result` event): `success` → graded; `error_max_turns` (or exit 53)
→ `max_turns`; an error naming a status the policy cannot cause (5xx, connection) →
`engine_error`; a context overflow → graded with `context_exhausted`; other errors →
`infra_error`; no result event → `infra_error` (did not start or crashed).
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
    infra,
    jsonl,
)
from legorl.harness.gemini_cli import TURN_LIMIT_EXIT, error_verdict, quiet_settings
from legorl.harness.install import require
from legorl.sandbox.base import ExecResult
from legorl.types import Status, Task

SETTINGS = f"{HOME}/.qwen/settings.json"
OUT = f"{AGENT_DIR}/qwen.jsonl"
ERR = f"{AGENT_DIR}/qwen.err"
ENTRY = "lib/node_modules/@qwen-code/qwen-code/cli.js"


@dataclass(frozen=True)
class QwenCode(NativeAdapter):
    """Adapter for Qwen Code 0.24.x."""

    model: str = "legorl-policy"  # the `model` it sends (keep it fixed)
    max_turns: int = MAX_TURNS  # --max-session-turns
    max_output_tokens: int = 4096  # model.generationConfig.max_tokens
    context_window: int = 131072  # model.generationConfig.contextWindowSize (drives compression)
    compression_threshold: float = 0.7  # model.chatCompression.contextPercentageThreshold
    name: str = "qwen-code"
    action_format: ClassVar[ActionFormat] = TOOL_CALLS
    layers: tuple[str, ...] = ("node22", "qwen-code")

    def settings(self) -> dict:
        s = quiet_settings(self.model, self.max_turns, self.compression_threshold)
        s["security"]["auth"] = {"selectedType": "openai"}
        s["model"]["chatCompression"] = {"contextPercentageThreshold": self.compression_threshold}
        s["model"]["generationConfig"] = {
            "contextWindowSize": self.context_window,
            "samplingParams": {"max_tokens": self.max_output_tokens},
        }
        return s

    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        node = f"{require('node22')}/bin/node"
        entry = f"{require('qwen-code')}/{ENTRY}"
        env = {
            "OPENAI_BASE_URL": f"{base_url}/v1",
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_MODEL": self.model,
            "QWEN_CODE_NO_RELAUNCH": "true",
            "QWEN_SANDBOX": "false",
            "QWEN_TELEMETRY_ENABLED": "false",
            "QWEN_CODE_SYSTEM_SETTINGS_PATH": f"{AGENT_DIR}/no-system-settings.json",
        }
        cmd = (
            f"exec {shlex.quote(node)} {shlex.quote(entry)} --auth-type openai "
            f"--openai-base-url {shlex.quote(base_url + '/v1')} --openai-api-key {API_KEY} "
            f"--model {shlex.quote(self.model)} --yolo --output-format stream-json "
            f"--max-session-turns {self.max_turns} --chat-recording false < {PROBLEM_FILE} > {OUT} 2> {ERR}"
        )
        files = {SETTINGS: json.dumps(self.settings(), indent=1).encode()}
        return Launch(cmd, env, files, outputs={"events": OUT, "stderr": ERR}, binary=node)

    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        events = jsonl(outputs.get("events", ""))
        err_tail = outputs.get("stderr", "")[-1500:]
        results = [e for e in events if e.get("type") == "result"]
        details = {"exit_code": str(res.exit_code)}
        if not results:
            if res.exit_code == TURN_LIMIT_EXIT:
                return HarnessVerdict(Status.MAX_TURNS, details)
            return infra(f"qwen exited {res.exit_code} without a result event; stderr: {err_tail}")
        r = results[-1]
        subtype = str(r.get("subtype") or "")
        details.update({"num_turns": str(r.get("num_turns", "")), "subtype": subtype})
        if subtype == "success" and not r.get("is_error"):
            return HarnessVerdict(None, details)
        if subtype == "error_max_turns" or res.exit_code == TURN_LIMIT_EXIT:
            return HarnessVerdict(Status.MAX_TURNS, details)
        err = r.get("error")
        message = str((err.get("message") if isinstance(err, dict) else err) or r.get("result") or err_tail)
        if "turn" in message.lower() and "maximum" in message.lower():
            return HarnessVerdict(Status.MAX_TURNS, details)
        return error_verdict(message, details)
