"""Harness name → adapter, and `make_harness(name, **options)` with clear errors.

Built-ins are found through `HARNESSES` (name → `module:Class`, imported only when chosen).
Options are the adapter dataclass's fields (`model`, `max_turns`, and per harness e.g.
`context_window` for OpenCode or `condenser_max_size` for OpenHands); an unknown option is
an error that lists the known ones, so a typo in `[harness.options]` fails at start-up.
`action_format(name, **options)` is how that harness, so configured, takes an action from a
turn (its adapter's own `action_format`, the one place it is said; `legorl.harness.actions`).
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

from legorl.harness.actions import ActionFormat, format_of

HARNESSES: dict[str, str] = {
    "claude-code": "legorl.harness.claude_code:ClaudeCode",
    "codex": "legorl.harness.codex:Codex",
    "pi": "legorl.harness.pi:Pi",
    "opencode": "legorl.harness.opencode:OpenCode",
    "openhands": "legorl.harness.openhands:OpenHands",
    "openhands-warm": "legorl.harness.openhands_warm:WarmOpenHands",
    "mini-swe-agent": "legorl.harness.mini_swe_agent:MiniSweAgent",
    "mini-swe-agent-warm": "legorl.harness.warm_mini:WarmMiniSweAgent",
    "gemini-cli": "legorl.harness.gemini_cli:GeminiCli",
    "qwen-code": "legorl.harness.qwen_code:QwenCode",
}
NATIVE = tuple(n for n in HARNESSES if not n.endswith("-warm"))  # harness programs (warm: a way to run one)


def harness_class(name: str) -> type:
    if name not in HARNESSES:
        known = ", ".join([*HARNESSES, "command"])
        raise ValueError(f"unknown harness {name!r}; known: {known}")
    module, _, attr = HARNESSES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def make_harness(name: str, **options: Any) -> Any:
    """The adapter for `name` configured with `options` (`command` takes `command_file`)."""
    if name == "command":
        from legorl.harness.command import CommandHarness

        path = options.get("command_file")
        if path is None:
            raise ValueError("harness 'command' needs command_file (the shell script that is the agent)")
        return CommandHarness.from_file(Path(path))
    cls = harness_class(name)
    fields = {f.name for f in dataclasses.fields(cls) if f.init and f.name not in ("name", "layers")}
    options = {k: v for k, v in options.items() if v is not None and k != "command_file"}
    bad = sorted(set(options) - fields)
    if bad:
        raise ValueError(f"harness {name!r}: unknown option(s) {bad}; known: {', '.join(sorted(fields))}")
    return cls(**options)


def action_format(name: str, **options: Any) -> ActionFormat:
    """How harness `name`, configured with `options`, reads an action from the policy's turn."""
    return format_of(make_harness(name, **options))
