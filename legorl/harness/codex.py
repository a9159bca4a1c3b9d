"""Codex CLI (`codex exec`, the npm package's static musl binary) as a harness.

Pointing it at the proxy: only Codex's own config, `$CODEX_HOME/config.toml`, with a
`model_providers.legorl` entry (`base_url` = the session's `/v1`, `wire_api = "responses"`,
`env_key` naming the variable with the key) chosen by `model_provider`. Codex then sends
`POST /v1/responses` with `stream: true`, `store: false`,
`include: ["reasoning.encrypted_content"]`, `prompt_cache_key`, `client_metadata`, the
system prompt as `developer` messages and the tools `exec_command {cmd, ...}` (unified
exec, a PTY), `write_stdin`, `view_image`, `request_user_input`, … It never sends
`previous_response_id`: the whole conversation comes back each call, reasoning items with
their `reasoning_text` content and the `encrypted_content` the proxy filled in
(proxy/responses.py), tool arguments verbatim.

Headless: `codex exec --json --ephemeral --skip-git-repo-check
--dangerously-bypass-approvals-and-sandbox -C REPO -` with the prompt on stdin; approvals
`never` and `danger-full-access`, since the agent sandbox is the boundary (Codex's own
bubblewrap/landlock sandbox cannot nest in it). Off: the update check, analytics, OTEL
export, web search (a hosted tool no local policy can serve), goals, apps, plugins, image
generation and memories; `CODEX_HOME` is a fresh directory outside /tmp (there Codex would
refuse to create its `apply_patch` PATH helper).
The static binary is run directly (`bin/codex-native`): the npm launcher needs node,
which task images lack.

Sub-agents (on; `sub_agents=False` writes `[agents] enabled = false`): the tools come as
one `namespace` tool, `multi_agent_v1` {spawn_agent, wait_agent, send_input, resume_agent,
close_agent}, which the proxy flattens (proxy/responses.py). `spawn_agent {message}` starts
a thread in the same process (same cwd, same provider, so the same proxy session: its
requests carry `thread_source: "subagent"` in `client_metadata`) and answers at once with
`{"agent_id", "nickname"}`; `wait_agent {targets}` returns its final message, and a
`<subagent_notification>` user message brings it again. A sub-agent gets no sub-agent
tools itself (depth 1). Its conversation starts from its own prompt, so its turns form
their own segment (trajectory.assemble). Its commands are not in the `--json` events (only
the parent's `collab_tool_call` items are), so `max_turns` bounds the parent's tool calls
and the wall-clock limit bounds a sub-agent.

Compaction: Codex compacts when the conversation reaches `model_auto_compact_token_limit`
(`auto_compact_limit`; default: 90% of `model_context_window`), with a summarisation
request on the same endpoint; `context_window` sets `model_context_window`.

Turn limit: Codex has no step limit of its own, so `max_turns` is enforced from outside:
the adapter counts Codex's completed tool calls in its `--json` event stream and stops it
after `max_turns` of them → `max_turns` (turn_limit.py).

Ending (the JSONL events): `turn.completed` → graded; an answer cut at the proxy's `max_tokens` (Codex gives up on an
`incomplete`
response: "Incomplete response returned, reason: max_output_tokens") → `format_error`;
`turn.failed` / `error` with a 5xx or a connection failure → `engine_error`,
another API error → `infra_error`; a context overflow it could not compact → graded;
no `turn.*` event at all → it did not start → `infra_error`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import ClassVar

from legorl.harness.actions import RESPONSES_ITEMS, ActionFormat
from legorl.harness.base import (
    AGENT_DIR,
    API_KEY,
    MAX_TURNS,
    PROBLEM_FILE,
    HarnessVerdict,
    Launch,
    NativeAdapter,
    infra,
    jsonl,
)
from legorl.harness.install import require
from legorl.harness.turn_limit import LIMIT_MARK, limited
from legorl.sandbox.base import ExecResult
from legorl.types import Status, Task

# Outside /tmp: under a temporary dir Codex refuses to create its PATH helpers (the
# `apply_patch` alias a policy may call from the shell). It dies with the sandbox anyway.
CODEX_HOME = "/var/lib/legorl-codex"
OUT = f"{AGENT_DIR}/codex.jsonl"
ERR = f"{AGENT_DIR}/codex.err"
LIMIT = f"{AGENT_DIR}/codex.limit"
PROVIDER = "legorl"
KEY_VAR = "LEGORL_API_KEY"
# Features that reach outside the sandbox or start work we do not train: off, so the tool
# list is function tools (and the sub-agent namespace) only.
OFF_FEATURES = (
    "goals",
    "apps",
    "plugins",
    "image_generation",
    "memories",
    "remote_plugin",
    "tool_suggest",
    "browser_use",
    "computer_use",
    "in_app_updates",
)
# The `--json` items that are the parent's tool calls: its commands and its sub-agent calls.
CALL_ITEMS = ("command_execution", "collab_tool_call")
CONTEXT_OVERFLOW = ("context window", "context_length_exceeded", "maximum context length", "prompt is too long")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Codex(NativeAdapter):
    """Adapter for Codex CLI 0.169.x."""

    model: str = "legorl-policy"  # the name Codex sends (it looks up no metadata for unknown names)
    # (no output limit: Codex sends none and has no setting for one; the proxy's max_tokens caps it)
    max_turns: int = MAX_TURNS  # completed tool calls before the adapter stops it (Codex has no limit)
    context_window: int = 32768  # model_context_window: drives auto-compaction
    auto_compact_limit: int | None = None  # model_auto_compact_token_limit (tokens)
    max_retries: int = 2  # request_max_retries / stream_max_retries
    sub_agents: bool = True  # Codex's `multi_agent_v1` tools (spawn_agent, wait_agent, …): `[agents] enabled`
    name: str = "codex"
    # function_call items over the Responses API
    action_format: ClassVar[ActionFormat] = RESPONSES_ITEMS
    layers: tuple[str, ...] = ("codex",)

    def config(self, base_url: str) -> str:
        top: dict[str, object] = {
            "model": self.model,
            "model_provider": PROVIDER,
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access",
            "check_for_update_on_startup": False,
            "web_search": "disabled",
            "model_context_window": self.context_window,
            "hide_agent_reasoning": False,
            "show_raw_agent_reasoning": True,
        }
        if self.auto_compact_limit:
            top["model_auto_compact_token_limit"] = self.auto_compact_limit
        provider = {
            "name": "LEGO-RL proxy",
            "base_url": f"{base_url}/v1",
            "wire_api": "responses",
            "env_key": KEY_VAR,
            "request_max_retries": self.max_retries,
            "stream_max_retries": self.max_retries,
            "stream_idle_timeout_ms": 600_000,
        }
        lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
        lines += ["", f"[model_providers.{PROVIDER}]", *(f"{k} = {_toml(v)}" for k, v in provider.items())]
        lines += [
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[otel]",
            'exporter = "none"',
            "",
            "[agents]",  # sub-agents: the `multi_agent_v1` namespace tool
            f"enabled = {_toml(self.sub_agents)}",
            "",
            "[features]",
            *(f"{f} = false" for f in OFF_FEATURES),
        ]
        return "\n".join(lines) + "\n"

    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        layer = require("codex")
        binary = f"{layer}/bin/codex-native"
        env = {
            "CODEX_HOME": CODEX_HOME,
            KEY_VAR: API_KEY,
            "CODEX_MANAGED_BY_NPM": "1",
            "CODEX_MANAGED_PACKAGE_ROOT": f"{layer}/lib/node_modules/@openai/codex",
            "PATH": f"{layer}/codex-path:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "RUST_LOG": "error",
        }
        run = (
            f"{shlex.quote(binary)} exec --json --ephemeral --skip-git-repo-check "
            f"--dangerously-bypass-approvals-and-sandbox -C {shlex.quote(repo_dir)} - < {PROBLEM_FILE}"
        )
        cmd = limited(
            run,
            fifo=f"{AGENT_DIR}/codex.fifo",
            events=OUT,
            stderr=ERR,
            marker=LIMIT,
            max_turns=self.max_turns,
            pattern="|".join(f'*\'"type":"item.completed"\'*\'"type":"{k}"\'*' for k in CALL_ITEMS),
        )
        files = {f"{CODEX_HOME}/config.toml": self.config(base_url).encode()}
        outputs = {"events": OUT, "stderr": ERR, "limit": LIMIT}
        return Launch(cmd, env, files, outputs=outputs, binary=binary)

    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        events = jsonl(outputs.get("events", ""))
        err_tail = outputs.get("stderr", "")[-1500:]
        items = [e.get("item") or {} for e in events if e.get("type") == "item.completed"]
        calls = sum(1 for i in items if i.get("type") in CALL_ITEMS)
        spawned = sum(1 for i in items if i.get("type") == "collab_tool_call" and i.get("tool") == "spawn_agent")
        details = {"tool_calls": str(calls)}  # compactions: Codex prints no event for them
        if spawned:
            details["sub_agents"] = str(spawned)
        if LIMIT_MARK in outputs.get("limit", ""):
            return HarnessVerdict(Status.MAX_TURNS, details)
        ends = [e for e in events if e.get("type") in ("turn.completed", "turn.failed")]
        errors = [
            str((e.get("error") or {}).get("message") or e.get("message") or "")
            for e in events
            if e.get("type") in ("turn.failed", "error")
        ]
        if not ends and not errors:
            return infra(f"codex exited {res.exit_code} without a turn event; stderr: {err_tail}")
        if ends and ends[-1].get("type") == "turn.completed":
            return HarnessVerdict(None, details)
        details["error"] = (errors[-1] if errors else err_tail)[:1500]
        low = details["error"].lower()
        if "max_output_tokens" in low:  # "Incomplete response returned, reason: max_output_tokens"
            details["output_token_limit"] = "1"  # the policy's answer hit the proxy's max_tokens
            return HarnessVerdict(Status.FORMAT_ERROR, details)
        if any(h in low for h in CONTEXT_OVERFLOW):
            details["context_exhausted"] = "1"
            return HarnessVerdict(None, details)
        if any(h in low for h in ("500", "502", "503", "504", "connection", "stream disconnected", "timed out")):
            return HarnessVerdict(Status.ENGINE_ERROR, details)
        return HarnessVerdict(Status.INFRA_ERROR, details)
