"""How a harness reads an action out of the policy's turn: its action format.

Harnesses do not all act through the dialect's tool calls. Claude Code, Codex (its
`function_call` items), OpenCode, OpenHands and the rest read the tool calls the proxy
parsed from the completion; mini-swe-agent's text-based agent (`litellm_textbased`, the
quickstart's config) reads a fenced command block out of the message text instead, and
its tool-call agent (the built-in `mini.yaml`) insists on a `bash` call in every turn.
A monitor that counts "turns without a tool call" therefore reads every quickstart turn
as a failure. Each adapter says which format it acts through (`action_format`), the run
store records it per harness, and the metrics and monitors judge a turn by it:

- `tool_calls`: the turn parses when the proxy found no malformed call in it. With
  `required` (mini's tool-call agent), a turn without a call, or with a call to a tool
  outside `tools`, is a parse failure too; without it a prose turn is a normal answer
  (how Claude Code ends a task).
- `text_block`: the turn parses when its message text (reasoning stripped) holds exactly
  one match of `pattern`, mini-swe-agent's own rule (`parse_regex_actions`: "Expected
  exactly 1 action"; anything else is its `FormatError`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, Literal, Protocol

MINI_ACTION_REGEX = r"```mswea_bash_command\s*\n(.*?)\n```"  # LitellmTextbasedModelConfig.action_regex (2.4.x)
_THINK_END = "</think>"


class TurnLike(Protocol):
    """What a turn needs for its action to be judged (`legorl.types.Turn` has it)."""

    response_text: str
    tool_calls: list[dict[str, Any]]
    format_error: bool


@dataclass(frozen=True)
class ActionFormat:
    """How one harness takes an action from a turn (see the module docstring)."""

    kind: Literal["tool_calls", "text_block"]
    label: str  # for people: "tool calls", "one ```mswea_bash_command block"
    pattern: str = ""  # text_block: the regex whose matches are actions
    required: bool = False  # tool_calls: every turn must carry a call
    tools: tuple[str, ...] = ()  # tool_calls with `required`: the only tools the harness accepts

    @cached_property
    def _regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern, re.DOTALL)

    def actions(self, turn: TurnLike) -> int:
        """How many actions the harness reads from `turn` (malformed calls count none)."""
        if self.kind == "text_block":
            text = turn.response_text or ""
            text = text.rsplit(_THINK_END, 1)[-1] if _THINK_END in text else text
            return len(self._regex.findall(text))
        if turn.format_error:
            return 0
        return len(turn.tool_calls)

    def parses(self, turn: TurnLike) -> bool:
        """Whether the harness could read `turn` as its action format (or as a final answer)."""
        if self.kind == "text_block":
            return self.actions(turn) == 1
        if turn.format_error:
            return False
        if not self.required:
            return True
        names = [c.get("name") for c in turn.tool_calls]
        return bool(names) and (not self.tools or all(n in self.tools for n in names))

    def acts(self, turn: TurnLike) -> bool:
        """Whether the harness takes an action from `turn` (it parses and holds one)."""
        return self.parses(turn) and self.actions(turn) > 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tools"] = list(self.tools)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ActionFormat:
        kind = d.get("kind")
        if kind not in ("tool_calls", "text_block"):
            raise ValueError(f"unknown action format kind {kind!r}; expected 'tool_calls' or 'text_block'")
        return cls(
            kind=kind,
            label=str(d.get("label") or kind),
            pattern=str(d.get("pattern") or ""),
            required=bool(d.get("required")),
            tools=tuple(d.get("tools") or ()),
        )


TOOL_CALLS = ActionFormat("tool_calls", "tool calls")
RESPONSES_ITEMS = ActionFormat("tool_calls", "function_call items")  # Codex, over the Responses API
MINI_BASH_TOOL = ActionFormat("tool_calls", "a bash tool call in every turn", required=True, tools=("bash",))


def text_block(pattern: str = MINI_ACTION_REGEX) -> ActionFormat:
    """mini-swe-agent's text-based format for `pattern`, labelled by the fence it expects."""
    fence = re.match(r"^(```|<)([A-Za-z_]+)", pattern)
    label = f"one {fence.group(1)}{fence.group(2)}{'>' if fence.group(1) == '<' else ''} block" if fence else pattern
    return ActionFormat("text_block", label, pattern=pattern)


def mini_format(config: Mapping[str, Any]) -> ActionFormat:
    """The action format of a mini-swe-agent YAML config (its `model` section), as its
    `get_model_class` picks the class: a text-based one (`litellm_textbased`, or a full path
    to a `...TextbasedModel`) reads `action_regex` blocks; no `model_class` means LiteLLM's
    tool-call model (so mini-swe-agent's own `mini_textbased.yaml`, which sets none, acts
    through bash calls unless `--model-class` says otherwise), as every other class does."""
    model = config.get("model") or {}
    if "textbased" in str(model.get("model_class") or "").lower():
        return text_block(str(model.get("action_regex") or MINI_ACTION_REGEX))
    return MINI_BASH_TOOL


def format_of(harness: object) -> ActionFormat:
    """The action format an adapter declares (every adapter in the registry does)."""
    fmt = getattr(harness, "action_format", None)
    if not isinstance(fmt, ActionFormat):
        raise TypeError(f"harness {getattr(harness, 'name', harness)!r} declares no action_format")
    return fmt
