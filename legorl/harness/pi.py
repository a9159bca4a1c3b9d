"""Pi (`pi -p --mode json`, the npm package `@mariozechner/pi-coding-agent`) as a harness.

Pointing it at the proxy: only Pi's own config, in `PI_CODING_AGENT_DIR` (fresh HOME):
`models.json` adds a provider `legorl` whose `baseUrl` is the session's `/v1` and whose
`api` is the wire format (`api` option), and `settings.json` makes it the default and
sets compaction and retries. Which API: `openai-completions` (the default here) sends
chat completions, streamed, with `reasoning_content` replayed on assistant messages
(compat `requiresReasoningContentOnAssistantMessages`), the system prompt as a `system`
message (`supportsDeveloperRole: false`), `max_tokens`, `stream_options`, and tool calls
whose arguments Pi re-serialises compactly (the proxy splices its own sampled ids back, so
the record stays token-exact: one segment per oracle rollout); `anthropic-messages`
(option `api`) replays thinking blocks and tool input objects instead.

Headless: `pi -p --mode json --no-session --offline --no-extensions --no-skills
--no-prompt-templates --no-themes --no-context-files --tools read,bash,edit,write,grep,find,ls`
in the repository, the prompt on stdin. Pi runs tools itself, inside the sandbox, with
no permission prompts. Off: update check and install telemetry (`--offline`,
`PI_SKIP_VERSION_CHECK`, `PI_TELEMETRY=0`, `enableInstallTelemetry: false`). Pi is a
node program: the layer carries a node runtime (install.py).

Compaction: Pi compacts at the end of a prompt when the context passed the model's
`contextWindow` minus `compaction.reserveTokens` (`context_window`, `reserve_tokens`), and
on an overflow error, with a summarisation request without tools (the last
`keepRecentTokens` stay verbatim). In print mode it does not retry the overflowing call
after that (the retry is scheduled after the prompt returned): the run ends, graded.

Turn limit: Pi has none; the adapter counts `tool_execution_end` events and stops it
after `max_turns` (turn_limit.py) → `max_turns`. Ending: `agent_end` whose last assistant
message has `stopReason` `stop`/`length` → graded; `error` with an API error → 5xx or no
connection `engine_error`, another status `infra_error`; a context overflow it could not
compact → graded; no `agent_end` → it crashed or did not start → `infra_error`.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any, ClassVar

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
from legorl.harness.turn_limit import LIMIT_MARK, limited
from legorl.sandbox.base import ExecResult
from legorl.types import Status, Task

AGENT_CONFIG = f"{HOME}/.pi/agent"
OUT = f"{AGENT_DIR}/pi.jsonl"
ERR = f"{AGENT_DIR}/pi.err"
LIMIT = f"{AGENT_DIR}/pi.limit"
PROVIDER = "legorl"
KEY_VAR = "LEGORL_API_KEY"
DEFAULT_TOOLS = "read,bash,edit,write,grep,find,ls"
APIS = ("openai-completions", "anthropic-messages")
CONTEXT_OVERFLOW = ("context window", "context_length_exceeded", "maximum context length", "prompt is too long")
_STATUS = re.compile(r"\b([45]\d\d)\b")


@dataclass(frozen=True)
class Pi(NativeAdapter):
    """Adapter for Pi 0.73.x."""

    model: str = "legorl-policy"
    max_turns: int = MAX_TURNS  # finished tool calls before the adapter stops it (Pi has no limit)
    max_output_tokens: int = 4096  # the model's maxTokens -> max_tokens
    context_window: int = 32768  # the model's contextWindow: drives compaction
    reserve_tokens: int = 4096  # compaction.reserveTokens
    keep_recent_tokens: int = 8000  # compaction.keepRecentTokens
    api: str = "openai-completions"  # the wire format Pi speaks to the proxy (APIS)
    thinking: str = "medium"  # --thinking: Pi sends/replays reasoning unless "off"
    tools: str = DEFAULT_TOOLS
    max_retries: int = 2  # retry.maxRetries: Pi's own retries of a failed call (backoff from 1 s; none in its SDK)
    api_timeout_s: int = 600  # retry.provider.timeoutMs: per model call
    name: str = "pi"
    action_format: ClassVar[ActionFormat] = TOOL_CALLS
    layers: tuple[str, ...] = ("pi",)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"harness 'pi': api {self.api!r} is not one of {', '.join(APIS)}")

    def models(self, base_url: str) -> dict[str, Any]:
        model: dict[str, Any] = {
            "id": self.model,
            "name": self.model,
            "reasoning": self.thinking != "off",
            "input": ["text"],
            "contextWindow": self.context_window,
            "maxTokens": self.max_output_tokens,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        }
        provider: dict[str, Any] = {"apiKey": KEY_VAR, "api": self.api, "models": [model]}
        if self.api == "openai-completions":
            provider["baseUrl"] = f"{base_url}/v1"
            provider["compat"] = {
                "supportsDeveloperRole": False,
                "supportsStore": False,
                "supportsReasoningEffort": False,
                "maxTokensField": "max_tokens",
                "requiresReasoningContentOnAssistantMessages": True,
            }
        else:
            provider["baseUrl"] = base_url
        return {"providers": {PROVIDER: provider}}

    def settings(self) -> dict[str, Any]:
        return {
            "defaultProvider": PROVIDER,
            "defaultModel": self.model,
            "defaultThinkingLevel": self.thinking,
            "quietStartup": True,
            "enableInstallTelemetry": False,
            "collapseChangelog": True,
            "compaction": {
                "enabled": True,
                "reserveTokens": self.reserve_tokens,
                "keepRecentTokens": self.keep_recent_tokens,
            },
            "retry": {
                "enabled": self.max_retries > 0,
                "maxRetries": self.max_retries,
                "baseDelayMs": 1000,
                "provider": {"timeoutMs": self.api_timeout_s * 1000, "maxRetries": 0},
            },
        }

    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        layer = require("pi")
        node = f"{layer}/node/bin/node"
        cli = f"{layer}/lib/node_modules/@mariozechner/pi-coding-agent/dist/cli.js"
        env = {
            "PI_CODING_AGENT_DIR": AGENT_CONFIG,
            KEY_VAR: API_KEY,
            "PI_OFFLINE": "1",
            "PI_SKIP_VERSION_CHECK": "1",
            "PI_TELEMETRY": "0",
            "PATH": f"{layer}/node/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "NODE_OPTIONS": "--max-old-space-size=1024",
        }
        run = (
            f"{shlex.quote(node)} {shlex.quote(cli)} -p --mode json --no-session --offline --no-extensions "
            f"--no-skills --no-prompt-templates --no-themes --no-context-files "
            f"--provider {PROVIDER} --model {shlex.quote(self.model)} --thinking {shlex.quote(self.thinking)} "
            f"--tools {shlex.quote(self.tools)} < {PROBLEM_FILE}"
        )
        cmd = limited(
            run,
            fifo=f"{AGENT_DIR}/pi.fifo",
            events=OUT,
            stderr=ERR,
            marker=LIMIT,
            max_turns=self.max_turns,
            pattern='\'{"type":"tool_execution_end"\'*',
        )
        files = {
            f"{AGENT_CONFIG}/models.json": json.dumps(self.models(base_url), indent=1).encode(),
            f"{AGENT_CONFIG}/settings.json": json.dumps(self.settings(), indent=1).encode(),
        }
        return Launch(cmd, env, files, outputs={"events": OUT, "stderr": ERR, "limit": LIMIT}, binary=node)

    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        events = jsonl(outputs.get("events", ""))
        err_tail = outputs.get("stderr", "")[-1500:]
        calls = sum(1 for e in events if e.get("type") == "tool_execution_end")
        compactions = sum(1 for e in events if e.get("type") == "compaction_end" and e.get("result"))
        details = {"tool_calls": str(calls), "compactions": str(compactions)}
        if LIMIT_MARK in outputs.get("limit", ""):
            return HarnessVerdict(Status.MAX_TURNS, details)
        ends = [e for e in events if e.get("type") == "agent_end"]
        if not ends:
            return infra(f"pi exited {res.exit_code} without an agent_end event; stderr: {err_tail}")
        last = next(
            (
                m
                for m in reversed(ends[-1].get("messages") or [])
                if isinstance(m, dict) and m.get("role") == "assistant"
            ),
            {},
        )
        reason = str(last.get("stopReason") or "")
        details["stop_reason"] = reason
        if reason not in ("error", "aborted"):
            return HarnessVerdict(None, details)
        details["error"] = str(last.get("errorMessage") or err_tail)[:1500]
        low = details["error"].lower()
        if any(h in low for h in CONTEXT_OVERFLOW):
            details["context_exhausted"] = "1"
            return HarnessVerdict(None, details)
        m = _STATUS.search(details["error"])
        if http_status_is_infra(int(m.group(1)) if m else None):
            return HarnessVerdict(Status.ENGINE_ERROR, details)
        return HarnessVerdict(Status.INFRA_ERROR, details)
