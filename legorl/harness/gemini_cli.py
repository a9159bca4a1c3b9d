"""Gemini CLI (`@google/gemini-cli` 0.61.x, a Node.js bundle) as a harness; the Gemini API dialect.

Pointing it at the proxy: `GOOGLE_GEMINI_BASE_URL` is the session's base URL (the SDK
appends `/v1beta/models/{model}:streamGenerateContent?alt=sse`), `GEMINI_API_KEY` any key
(sent as `x-goog-api-key`), auth type `gemini-api-key` in the user settings
(`$HOME/.gemini/settings.json`), `--model` the harness-side model name. Headless: the
prompt on stdin (no TTY: non-interactive), `--yolo` (every tool call approved),
`--output-format stream-json`, run in the repository. Tools (run_shell_command,
read_file, replace, write_file, glob, grep_search, ...) run in the sandbox.

Off, through its own settings and environment: usage statistics and telemetry, auto-update
and its notification, IDE integration, folder trust prompts, checkpointing, the
downloaded ripgrep (the built-in grep is used), the interactive shell (node-pty), the
LLM loop-detection and next-speaker side calls, sub-agents, the web tools
(`tools.exclude`), the relaunch into a child process (`GEMINI_CLI_NO_RELAUNCH`), and the
CLI's own sandbox. `maxSessionTurns` is the turn
limit.

Compaction: Gemini CLI compresses its history (a summary call) when the last prompt's
`usageMetadata.promptTokenCount` exceeds `compressionThreshold` × the model's token limit
(1,048,576 for a name it does not know), but only up to a user message that is not a
function response: a one-prompt headless run has no such split point, so it never
compresses. A prompt the proxy refuses as too long (400) ends the run; it is graded
(`context_exhausted`), the policy's context having grown too long.

Ending (`stream-json` JSONL; the last event is `result`): `status: success` → graded;
exit 53 (`FatalTurnLimitedError`) or a `max_turns` error → `max_turns`; an `error`
result naming an HTTP status the policy cannot cause (5xx, connection) →
`engine_error`; a context overflow → graded with `context_exhausted`; any other error
result → `infra_error`; no result at all → `infra_error` (did not start or crashed).
"""

from __future__ import annotations

import json
import re
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

SETTINGS = f"{HOME}/.gemini/settings.json"
OUT = f"{AGENT_DIR}/gemini.jsonl"
ERR = f"{AGENT_DIR}/gemini.err"
ENTRY = "lib/node_modules/@google/gemini-cli/bundle/gemini.js"
TURN_LIMIT_EXIT = 53  # FatalTurnLimitedError
NETWORK_TOOLS = ("web_fetch", "google_web_search", "web_search")  # excluded: a sandbox has no network
_STATUS = re.compile(r"\b(?:status|code)[\"':\s]*([1-5]\d\d)\b|\[(\d{3}) ")


def quiet_settings(model: str, max_turns: int, compression_threshold: float) -> dict:
    """The settings Gemini CLI and its fork Qwen Code share: nothing but model calls."""
    return {
        "general": {
            "enableAutoUpdate": False,
            "enableAutoUpdateNotification": False,
            "disableAutoUpdate": True,
            "disableUpdateNag": True,
            "checkpointing": {"enabled": False},
            "enableNotifications": False,
        },
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False, "logPrompts": False},
        "ide": {"enabled": False, "hasSeenNudge": True},
        "security": {"folderTrust": {"enabled": False}},
        "model": {
            "name": model,
            "maxSessionTurns": max_turns,
            "compressionThreshold": compression_threshold,
            "skipNextSpeakerCheck": True,
            "disableLoopDetection": True,
            "skipLoopDetection": True,
        },
        "tools": {
            "sandbox": False,
            "useRipgrep": False,
            "shell": {"enableInteractiveShell": False},
            "exclude": list(NETWORK_TOOLS),
        },
        "experimental": {"enableAgents": False, "extensionManagement": False},
        "ui": {"hideTips": True, "hideBanner": True},
    }


def error_verdict(message: str, details: dict[str, str]) -> HarnessVerdict:
    """An API error as a status: context overflow graded, 5xx/no status engine, else infra."""
    details["error"] = message[:1500]
    low = message.lower()
    if "exceeds the maximum number of tokens" in low or "maximum context length" in low:
        details["context_exhausted"] = "1"
        return HarnessVerdict(None, details)
    m = _STATUS.search(message)
    status = int(m.group(1) or m.group(2)) if m else None
    if status is None and not any(w in low for w in ("fetch failed", "econnrefused", "socket", "network")):
        return HarnessVerdict(Status.INFRA_ERROR, details)
    return HarnessVerdict(Status.ENGINE_ERROR if http_status_is_infra(status) else Status.INFRA_ERROR, details)


@dataclass(frozen=True)
class GeminiCli(NativeAdapter):
    """Adapter for Gemini CLI 0.61.x."""

    model: str = "legorl-policy"  # the name Gemini CLI sends in the URL (keep it fixed)
    max_turns: int = MAX_TURNS  # model.maxSessionTurns
    compression_threshold: float = 0.5  # model.compressionThreshold (fraction of the model's token limit)
    name: str = "gemini-cli"
    action_format: ClassVar[ActionFormat] = TOOL_CALLS
    layers: tuple[str, ...] = ("node22", "gemini-cli")

    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        node = f"{require('node22')}/bin/node"
        entry = f"{require('gemini-cli')}/{ENTRY}"
        settings = quiet_settings(self.model, self.max_turns, self.compression_threshold)
        settings["security"]["auth"] = {"selectedType": "gemini-api-key"}
        env = {
            "GOOGLE_GEMINI_BASE_URL": base_url,
            "GEMINI_API_KEY": API_KEY,
            "GEMINI_MODEL": self.model,
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "GEMINI_SANDBOX": "false",
            "GEMINI_TELEMETRY_ENABLED": "false",
            "GEMINI_CLI_SYSTEM_SETTINGS_PATH": f"{AGENT_DIR}/no-system-settings.json",
            "GEMINI_CLI_SYSTEM_DEFAULTS_PATH": f"{AGENT_DIR}/no-system-defaults.json",
        }
        cmd = (
            f"exec {shlex.quote(node)} {shlex.quote(entry)} --yolo --output-format stream-json "
            f"--model {shlex.quote(self.model)} < {PROBLEM_FILE} > {OUT} 2> {ERR}"
        )
        files = {SETTINGS: json.dumps(settings, indent=1).encode()}
        return Launch(cmd, env, files, outputs={"events": OUT, "stderr": ERR}, binary=node)

    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        events = jsonl(outputs.get("events", ""))
        err_tail = outputs.get("stderr", "")[-1500:]
        results = [e for e in events if e.get("type") == "result"]
        details = {
            "tool_calls": str(sum(1 for e in events if e.get("type") == "tool_use")),
            "exit_code": str(res.exit_code),
        }
        if res.exit_code == TURN_LIMIT_EXIT:
            return HarnessVerdict(Status.MAX_TURNS, details)
        if not results:
            errors = [e for e in events if e.get("type") == "error"]
            if errors:
                return error_verdict(str(errors[-1].get("message", "")), details)
            return infra(f"gemini exited {res.exit_code} without a result event; stderr: {err_tail}")
        r = results[-1]
        stats = r.get("stats") or {}
        details["turns"] = str(stats.get("tool_calls", stats.get("turns", "")))
        if r.get("status") == "success" and res.exit_code == 0:
            return HarnessVerdict(None, details)
        err = r.get("error") or {}
        message = str(err.get("message") if isinstance(err, dict) else err) or err_tail
        if (
            "max_turns" in str(err.get("type", "") if isinstance(err, dict) else "")
            or "maximum session turns" in message.lower()
        ):
            return HarnessVerdict(Status.MAX_TURNS, details)
        return error_verdict(message, details)
