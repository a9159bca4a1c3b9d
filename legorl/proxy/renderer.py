"""What a renderer is: the `Renderer` protocol, the request it renders, the state it splices.

The proxy renders every request itself (the engine only ever sees ids). Two renderers
implement `Renderer`: `chatml_renderer.ChatMLRenderer` (the bundled models' ChatML template,
hand-rendered, block by block) and `template.TemplateRenderer` (any published Jinja chat
template; `docs/chat-templates.md`); `renderer_choice.make_renderer` picks one per tokenizer,
and `render_cache` bounds their caches and renders huge prompts off the event loop. The
proxy's seams (`ProxyServer`, `ProxyContext`, the off-loop worker) are typed with the
protocol, so a third renderer is one class that satisfies it, not an edit of the proxy.

Both splice the policy's own sampled ids back into the prompt (`RenderState`): when an
assistant message the policy produced comes back in the history, its tokens are the ones
that were actually sampled, not the harness's re-serialisation (OpenCode re-stringifies tool
arguments compactly, OpenHands with `", "`; BPE could also tokenise the same text
differently). Messages match on content, reasoning and tool calls compared as parsed JSON
(`assistant_key`). So the next prompt extends the previous prompt+completion
token-for-token, and a trajectory stays one segment unless the harness really changed what
was said (compaction, edits).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import orjson

from legorl.proxy.completion import ParsedCompletion


@dataclass
class ChatRequest:
    """A dialect-independent request: OpenAI-chat-shaped messages with text content."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    add_generation_prompt: bool = True  # False: continue the trailing assistant message


def _canon_args(arguments: Any) -> str:
    # orjson: this runs for every tool call of every replayed assistant message on every
    # request (stdlib json here cost ~60 us per 7k-token request); the stdlib path keeps
    # what orjson refuses (NaN, integers beyond 64 bits). Only ever compared with itself.
    try:
        obj = orjson.loads(arguments) if isinstance(arguments, str) else arguments
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()
    except (orjson.JSONDecodeError, TypeError):
        pass
    try:
        obj = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return str(arguments)
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def assistant_key(content: str, reasoning: str | None, calls: list[tuple[str, Any]]) -> tuple:
    """What identifies an assistant message semantically (whitespace/JSON-format free)."""
    return (
        (content or "").strip(),
        (reasoning or "").strip(),
        tuple((name, _canon_args(args)) for name, args in calls),
    )


@dataclass
class Snapshot:
    """One policy turn as the template renderer splices it (`legorl.proxy.template`)."""

    prompt_text: str
    prompt_ids: list[int]
    completion_ids: list[int]
    key: tuple


class RenderState:
    """Per-session memory of what the policy sampled, for splicing.

    `sampled` serves the ChatML renderer (assistant messages matched by content);
    `snapshots` serves the template renderer (recent turns' prompt text and ids)."""

    max_snapshots = 4

    def __init__(self) -> None:
        self.sampled: dict[tuple, list[int]] = {}
        self.snapshots: list[Snapshot] = []
        self._texts: OrderedDict[int, tuple[list[int], str]] = OrderedDict()
        self.canon: tuple[str, list[int], list[tuple[int, int]]] | None = None  # last canonical rendering
        self.last_request: tuple | None = None  # (add_generation_prompt, messages, tools, text)

    def note_prompt(self, prompt_ids: list[int], text: str) -> None:
        """The text a prompt was rendered from (kept until its turn is remembered)."""
        self._texts[id(prompt_ids)] = (prompt_ids, text)
        while len(self._texts) > 8:
            self._texts.popitem(last=False)

    def remember(
        self, completion_ids: list[int], parsed: ParsedCompletion, prompt_ids: list[int] | None = None
    ) -> None:
        key = assistant_key(parsed.content, parsed.reasoning, [(c.name, c.arguments) for c in parsed.tool_calls])
        self.sampled[key] = list(completion_ids)
        hit = self._texts.pop(id(prompt_ids), None) if prompt_ids is not None else None
        if hit is not None and hit[0] is prompt_ids:
            self.snapshots.append(Snapshot(hit[1], prompt_ids, list(completion_ids), key))
            del self.snapshots[: -self.max_snapshots]


@runtime_checkable
class Renderer(Protocol):
    """The interface the proxy uses: token ids for a request, and the facts it needs about
    the model's completion format. `render` must equal the model's own chat template's ids
    (`renderer_choice.round_trip` checks it); `state` is the session's, for splicing."""

    tokenizer: Any  # the Hugging Face tokenizer it renders for (the proxy reads its backend)
    eos_ids: Collection[int]  # the ids that end a turn
    tool_format: str  # how the model writes tool calls (`legorl.proxy.toolcalls` format name)
    starts_in_reasoning: bool  # the generation prompt opens a think block

    def render(self, req: ChatRequest, state: RenderState | None = None) -> list[int]:
        """The prompt's token ids, with the policy's sampled ids spliced back from `state`."""
        ...

    def count(self, req: ChatRequest) -> int:
        """The prompt's length in tokens."""
        ...

    def encode(self, text: str) -> list[int]:
        """Plain text to ids (no special tokens added)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Ids to text, special tokens kept."""
        ...
