"""Harness name → adapter, and `make_harness(name, **options)` with clear errors.

Built-ins are found through `HARNESSES` (name → `module:Class`, imported only when chosen);
with `command` (the shell-script harness, `command.py`) they are every name there is, and
the config's `[harness] name` and the CLI's `--harness` help are derived from it
(`harness_names`, `names_help`), so a new harness is added here and nowhere else.
Options are the adapter dataclass's fields (`model`, `max_turns`, and per harness e.g.
`context_window` for OpenCode or `condenser_max_size` for OpenHands); `adapter_options`
derives them from the dataclass, and the config checks `[harness] options` against it when
it loads (`legorl.options`), so a typo or a wrong type fails before anything runs.
`action_format(name, **options)` is how that harness, so configured, takes an action from a
turn (its adapter's own `action_format`, the one place it is said; `legorl.harness.actions`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from legorl.harness.actions import ActionFormat
    from legorl.harness.base import Harness, HostHarness

# Importing this module stays cheap (the CLI reads the names for its help): what a chosen
# harness needs (pydantic, through legorl.options) is imported when one is built.

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
SUPPLIED = ("name", "layers", "model", "max_turns")  # the adapter's identity, and `[harness]` fields
NATIVE = tuple(n for n in HARNESSES if not n.endswith("-warm"))  # harness programs (warm: a way to run one)
COMMAND = "command"  # the shell script as the agent: built in, configured by its `command_file`


def harness_names() -> tuple[str, ...]:
    """Every harness name a config or the CLI accepts: `command`, then `HARNESSES`'."""
    return (COMMAND, *HARNESSES)


def names_help() -> str:
    """The names as `--harness` help lists them: `command`, the programs, then the warm ones."""
    native = ", ".join(sorted(n for n in HARNESSES if not n.endswith("-warm")))
    warm = ", ".join(sorted(n for n in HARNESSES if n.endswith("-warm")))
    return f"{COMMAND}, or: {native}; warm (one harness process beside the sandboxes): {warm}"


def harness_class(name: str) -> type:
    if name not in HARNESSES:
        known = ", ".join([*HARNESSES, COMMAND])
        raise ValueError(f"unknown harness {name!r}; known: {known}")
    module, _, attr = HARNESSES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def adapter_options(name: str) -> dict[str, Any]:
    """The `[harness] options` of harness `name`: its adapter's init fields (name → type),
    less those `[harness]` sets itself (`model_name`, `max_turns`); `command` takes none."""
    from legorl.options import declared

    return {} if name == COMMAND else declared(harness_class(name), supplied=SUPPLIED)


def make_harness(name: str, **options: Any) -> Harness | HostHarness:
    """The adapter for `name` configured with `options` (`command` takes `command_file`), the
    one place a harness is built (a run config's `[harness]` says its options with
    `HarnessSection.harness_options`)."""
    if name == COMMAND:
        from legorl.harness.command import CommandHarness

        path = options.get("command_file")
        if path is None:
            raise ValueError("harness 'command' needs command_file (the shell script that is the agent)")
        return CommandHarness.from_file(Path(path))
    from legorl.options import check_options

    cls = harness_class(name)
    given = {k: v for k, v in options.items() if v is not None and k != "command_file"}
    direct = {k: given.pop(k) for k in ("model", "max_turns") if k in given}
    return cls(**direct, **check_options(given, adapter_options(name), f"harness {name!r}"))


def action_format(name: str, **options: Any) -> ActionFormat:
    """How harness `name`, configured with `options`, reads an action from the policy's turn."""
    from legorl.harness.actions import format_of

    return format_of(make_harness(name, **options))
