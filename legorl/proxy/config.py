"""`[proxy]` config section: what the proxy samples with and what it refuses.

Sampling belongs to the trainer, not to the harness: a harness asking for
`temperature: 0` must not change the distribution the policy is trained on, so the
engine always samples with these values and each turn records both what was used and
what the harness asked for. Two harness requests are honoured because they change the
*protocol*, not the distribution: stop strings (OpenHands' non-native tool mode stops on
`</function`) and a smaller `max_tokens` (the harness sized its context around it).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from legorl.config_base import Section

# Requests that answer the harness but are not the policy acting in the episode:
# OpenCode's title generator and compaction agent, OpenHands' condenser, Claude Code's
# compaction instruction (appended to the last user message).
DEFAULT_SIDE_CALL_PATTERNS = [
    r"You are a context summarization assistant",  # Pi's compaction
    r"You are performing a CONTEXT CHECKPOINT COMPACTION",  # Codex's compaction
    r"You are a title generator",
    r"You are a context summarization agent",
    r"You are maintaining a context-aware state summary",
    r"Do NOT call any tools\. Respond with plain text only",
    r"You are a specialized system component responsible for distilling chat history",  # Gemini CLI
    r"You are the component that summarizes a conversation when its context window",  # Qwen Code
]


class ProxyConfig(Section):
    host: str = "127.0.0.1"
    """Interface the standalone server binds (loopback unless you mean otherwise)."""

    port: int = Field(0, ge=0, le=65535)
    """TCP port; 0 picks a free one (in-process rollouts). `legorl proxy --port` sets it."""

    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature used for every policy call (the harness's value is only recorded)."""

    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass used for every call."""

    top_k: int = -1
    """Top-k used for every call; -1 disables it."""

    max_tokens: int = Field(1024, ge=1)
    """Upper bound on completion tokens of every turn: the run config's word. A config
    raises it (an agent writing whole files needs more); a harness's own `max_tokens` can
    only lower it. Modest by default because a pretrained policy that misses its end token
    samples to the cap: SmolLM2 through mini-swe-agent once sampled 4,096 tokens (that
    harness's default request) in one turn."""

    seed: int | None = None
    """Engine seed (None: the engine's own randomness)."""

    stop: list[str] = Field(default_factory=list)
    """Stop strings added to every request (the harness's own `stop` is honoured too)."""

    tool_format: Literal["auto", "hermes", "qwen3_coder", "glm45", "harmony"] = "auto"
    """How the policy writes tool calls in its completion text; `auto`: the format of the
    model's own chat template (hermes for the bundled models)."""

    max_context: int = Field(32768, ge=16)
    """Context window in tokens: a longer prompt gets the dialect's honest
    'prompt is too long' 400, which makes Claude Code and OpenCode compact."""

    side_call_models: list[str] = Field(default_factory=list)
    """Model names whose calls are side calls (answered, recorded, left out of the trajectory)."""

    side_call_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_SIDE_CALL_PATTERNS))
    """Regexes searched in the first 1000 characters of the system prompt and the last 1000
    of the last user message; a match makes the call a side call (title generation, compaction)."""

    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    """Largest request body accepted; larger ones get 413 before being read."""

    max_json_depth: int = Field(128, ge=8, le=200)
    """Deepest nesting of arrays/objects accepted in a request body; deeper gets a 400 before
    anything is generated (the recorder's JSON encoder stops at 254 levels, hence at most 200)."""

    max_string_chars: int = Field(4 * 1024 * 1024, ge=1024)
    """Longest string (message text, tool result, key) accepted in a request body; longer gets a 400."""

    max_messages: int = Field(10_000, ge=1)
    """Most `messages` (Chat, Anthropic) or `input` items (Responses) in one request; more gets a 400."""

    header_timeout_s: float = Field(30.0, gt=0)
    """A connection must deliver a request's line and headers within this many seconds of
    opening (or of the request's first byte); past it the connection is closed (slowloris)."""

    body_timeout_s: float = Field(60.0, gt=0)
    """A request body must arrive in full within this many seconds of its headers; past it the
    client gets a 408 and the connection is closed."""

    offload_bytes: int = Field(256 * 1024, ge=0)
    """Bodies larger than this are parsed and tokenised on a worker thread, so a huge prompt
    does not stall other sessions' streams; smaller ones stay on the event loop (cheaper)."""

    render_cache_bytes: int = Field(256 * 1024 * 1024, ge=1 << 20)
    """Memory budget of the shared prompt-block cache (token ids of rendered messages and tool
    schemas), in estimated bytes; least recently used blocks are dropped past it."""

    session_idle_s: float = Field(3600.0, gt=0)
    """Standalone mode: a session without requests for this long is closed (its trajectory
    written), so sessions opened by one-off keys do not pile up. Managed sessions never expire.
    Keep it above `request_timeout_s`: a call still generating after it would be a late turn."""

    request_timeout_s: float = Field(600.0, gt=0)
    """Wall-clock limit of one engine generation; past it the client gets a 504/error event."""

    session_max_concurrency: int = Field(8, ge=1)
    """Most model calls one session may have in flight at once; one more gets a 429 (OpenAI and
    Anthropic clients back off and retry). A session that floods the engine cannot make its own
    timeouts look like engine faults: those count as the agent's (`proxy/blame.py`)."""

    served_model: str = "legorl-policy"
    """Name listed by /v1/models (any model name is accepted and routed to the policy)."""

    tune_gc: bool = True
    """Freeze the objects alive at start and raise the GC threshold (see `server.tune_gc`):
    ~0.3–0.5 ms less CPU per request; turn off if the host process relies on collecting
    cyclic garbage created before the proxy started."""

    record_request: bool = True
    """Keep each raw request body in its turn (and in turns.jsonl)."""

    @field_validator("side_call_patterns")
    @classmethod
    def _compiles(cls, v: list[str]) -> list[str]:
        for p in v:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"side_call_patterns: {p!r} is not a valid regex: {e}") from e
        return v
