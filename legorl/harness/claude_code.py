"""Claude Code (`claude -p`, the npm package's native binary) as a harness.

Pointing it at the proxy (docs/harnesses.md): `ANTHROPIC_BASE_URL` is the session's
base URL (Claude Code appends `/v1/messages?beta=true`), any API key. Headless:
`claude -p --output-format stream-json --verbose --dangerously-skip-permissions
--max-turns N --model NAME --tools Bash,Read,Edit,Write,Glob,Grep`, the prompt on stdin,
run in the repository. `IS_SANDBOX=1` lets root skip permissions. Off: all non-inference
traffic (telemetry, updates, error reports), the per-request attribution header,
prompt-caching markers, deferred tool loading and auto-memory; the background ("haiku"),
sonnet, opus and subagent model names all point at the policy's name, so no call leaves
for a model we do not serve.

The model name is the harness-side name (`model`), fixed per experiment: Claude Code
changes its system prompt and request shape by name (an unknown name gets the lean prompt
and a mid-conversation `role: system` message, which the proxy accepts).

Compaction: Claude Code compacts reactively when the proxy answers `prompt is too long`
(the proxy's `max_context`), or proactively when `auto_compact_window` is set
(`CLAUDE_CODE_AUTO_COMPACT_WINDOW`, which only lowers the assumed window).

Ending (the final `result` event): `success` → graded; `error_max_turns` → `max_turns`;
answers that kept hitting `max_tokens` ("exceeded the … output token maximum", after
Claude Code's own continuation retries) → `format_error`; `api_error` with a
5xx/connection failure → `engine_error`; other API errors (a 4xx the
proxy gave) → `infra_error`; `prompt_too_long` / `blocking_limit` (could not compact) →
graded; no result event at all → the binary did not start or crashed → `infra_error`.
"""

from __future__ import annotations

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

DEFAULT_TOOLS = "Bash,Read,Edit,Write,Glob,Grep"
OUT = f"{AGENT_DIR}/claude.jsonl"
ERR = f"{AGENT_DIR}/claude.err"


@dataclass(frozen=True)
class ClaudeCode(NativeAdapter):
    """Adapter for Claude Code 2.1.x."""

    model: str = "legorl-policy"  # the name Claude Code sends (changes its prompt: keep it fixed)
    max_turns: int = MAX_TURNS  # model calls (`--max-turns`)
    max_output_tokens: int = 4096  # CLAUDE_CODE_MAX_OUTPUT_TOKENS
    tools: str = DEFAULT_TOOLS
    auto_compact_window: int | None = None  # CLAUDE_CODE_AUTO_COMPACT_WINDOW (proactive compaction)
    api_timeout_s: int = 600  # per model call
    max_retries: int = 2  # Claude Code's own retries of a failed call
    name: str = "claude-code"
    # tool_use blocks over the Messages API; a prose turn is its final answer
    action_format: ClassVar[ActionFormat] = TOOL_CALLS
    layers: tuple[str, ...] = ("claude-code",)

    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        binary = f"{require('claude-code')}/bin/claude"
        env = {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_MODEL": self.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": self.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": self.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": self.model,
            "CLAUDE_CODE_SUBAGENT_MODEL": self.model,
            "CLAUDE_CONFIG_DIR": f"{HOME}/.claude",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
            "DISABLE_PROMPT_CACHING": "1",
            "ENABLE_TOOL_SEARCH": "false",
            "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(self.max_output_tokens),
            "API_TIMEOUT_MS": str(self.api_timeout_s * 1000),
            "CLAUDE_CODE_MAX_RETRIES": str(self.max_retries),
        }
        if self.auto_compact_window:
            env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(self.auto_compact_window)
        cmd = (
            f"exec {shlex.quote(binary)} -p --output-format stream-json --verbose --dangerously-skip-permissions "
            f"--max-turns {self.max_turns} --model {shlex.quote(self.model)} --tools {shlex.quote(self.tools)} "
            f"< {PROBLEM_FILE} > {OUT} 2> {ERR}"
        )
        return Launch(cmd, env, outputs={"events": OUT, "stderr": ERR}, binary=binary)

    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        events = jsonl(outputs.get("events", ""))
        results = [e for e in events if e.get("type") == "result"]
        err_tail = outputs.get("stderr", "")[-1500:]
        if not results:
            return infra(f"claude exited {res.exit_code} without a result event; stderr: {err_tail}")
        r = results[-1]
        reason = str(r.get("terminal_reason") or "")
        subtype = str(r.get("subtype") or "")
        details = {
            "num_turns": str(r.get("num_turns", "")),
            "subtype": subtype,
            "terminal_reason": reason,
            "session_id": str(r.get("session_id", "")),
            "compactions": str(sum(1 for e in events if e.get("subtype") == "compact_boundary")),
        }
        if subtype == "success" and not r.get("is_error"):
            return HarnessVerdict(None, details)
        if subtype == "error_max_turns" or reason == "max_turns":
            return HarnessVerdict(Status.MAX_TURNS, details)
        if reason in ("prompt_too_long", "blocking_limit"):
            details["context_exhausted"] = "1"
            return HarnessVerdict(None, details)
        details["error"] = str(r.get("result", ""))[:1500] or err_tail
        if "output token maximum" in details["error"]:  # the policy's answers kept hitting max_tokens
            details["output_token_limit"] = "1"
            return HarnessVerdict(Status.FORMAT_ERROR, details)
        if reason == "api_error" or "API Error" in details["error"]:
            status = r.get("api_error_status")
            if http_status_is_infra(status if isinstance(status, int) else None):
                return HarnessVerdict(Status.ENGINE_ERROR, details)
            return HarnessVerdict(Status.INFRA_ERROR, details)
        if subtype.startswith("error"):  # error_during_execution and kin: the harness broke
            return HarnessVerdict(Status.INFRA_ERROR, details)
        return HarnessVerdict(None, details)
