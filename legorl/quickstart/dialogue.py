"""mini-swe-agent's text-based agent loop, as a state machine the in-process path drives.

The quickstart runs the real mini-swe-agent (its `DefaultAgent` with the `litellm_textbased`
model, configured by `mini_quickstart.yaml`) through our proxy wherever it can. Bulk
evaluation and the many GSPO rollouts also run without it, in one process, with the same
messages: this module reproduces what that agent sends and how it reacts, from the same
YAML file, so that the two paths put the same conversation before the policy.
`tests/test_quickstart_harness.py` checks that claim by comparing the token ids the proxy
recorded from the real harness with the ids this module renders for the same episode.

Reproduced exactly (mini-swe-agent 2.4.6, agents/default.py, models/utils/actions_text.py,
environments/local.py): system + instance messages; `step_limit` checked before each query;
exactly one action per reply (its `action_regex`), else a user message from
`format_error_template` and, after `max_consecutive_format_errors` in a row, the exit
`RepeatedFormatError`; the observation message from `observation_template`; the exit
`Submitted` when a command's output starts with COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT and
exits 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from jinja2 import StrictUndefined, Template

CONFIG_PATH = Path(__file__).resolve().parent / "mini_quickstart.yaml"
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@lru_cache(maxsize=4)
def load_agent_config(path: Path = CONFIG_PATH) -> dict[str, Any]:
    cfg = yaml.safe_load(Path(path).read_text())
    for section, keys in {
        "agent": ("system_template", "instance_template", "step_limit", "max_consecutive_format_errors"),
        "model": ("action_regex", "observation_template", "format_error_template"),
    }.items():
        for key in keys:
            if key not in cfg.get(section, {}):
                raise ValueError(f"{path}: {section}.{key} is missing")
    return cfg


@lru_cache(maxsize=64)
def _template(text: str) -> Template:
    return Template(text, undefined=StrictUndefined)


def observation_text(cfg: dict[str, Any], output: dict[str, Any]) -> str:
    return _template(cfg["model"]["observation_template"]).render(output=output)


def format_error_text(cfg: dict[str, Any], actions: list[str], error: str, finish_reason: str) -> str:
    return _template(cfg["model"]["format_error_template"]).render(
        actions=actions, error=error, finish_reason=finish_reason
    )


def parse_actions(cfg: dict[str, Any], content: str) -> list[str]:
    return [a.strip() for a in re.findall(cfg["model"]["action_regex"], content, re.DOTALL)]


def submitted(output: dict[str, Any]) -> bool:
    lines = output.get("output", "").lstrip().splitlines(keepends=True)
    return bool(lines) and lines[0].strip() == SUBMIT_MARKER and output.get("returncode") == 0


@dataclass
class Dialogue:
    """One episode's messages and exit status, advanced by replies and command outputs."""

    cfg: dict[str, Any]
    task_text: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    n_calls: int = 0
    format_errors_in_a_row: int = 0
    exit_status: str = ""  # "" while running; Submitted, LimitsExceeded, RepeatedFormatError

    def __post_init__(self) -> None:
        agent = self.cfg["agent"]
        self.messages = [
            {"role": "system", "content": _template(agent["system_template"]).render(task=self.task_text)},
            {"role": "user", "content": _template(agent["instance_template"]).render(task=self.task_text)},
        ]

    @property
    def done(self) -> bool:
        return bool(self.exit_status)

    def wants_query(self) -> bool:
        """True when the agent would query the model now; sets LimitsExceeded when it may not."""
        limit = int(self.cfg["agent"]["step_limit"])
        if 0 < limit <= self.n_calls:
            self.exit_status = "LimitsExceeded"
            return False
        return not self.done

    def out_of_context(self) -> None:
        """The prompt no longer fits the model's context: the proxy answers 400, LiteLLM
        raises ContextWindowExceededError, which mini-swe-agent does not catch."""
        self.exit_status = "ContextWindowExceededError"

    def on_reply(self, content: str, finish_reason: str) -> str | None:
        """Record the model's reply; the command to execute, or None after a format error."""
        self.n_calls += 1
        actions = parse_actions(self.cfg, content)
        if len(actions) != 1:
            error = f"Expected exactly 1 action, found {len(actions)}."
            self.messages.append({"role": "user", "content": format_error_text(self.cfg, actions, error, finish_reason)})
            self.format_errors_in_a_row += 1
            limit = int(self.cfg["agent"]["max_consecutive_format_errors"])
            if 0 < limit <= self.format_errors_in_a_row:
                self.exit_status = "RepeatedFormatError"
            return None
        self.format_errors_in_a_row = 0
        self.messages.append({"role": "assistant", "content": content})
        return actions[0]

    def on_output(self, output: dict[str, Any]) -> None:
        """Record a command's output (keys: output, returncode, exception_info)."""
        if submitted(output):
            self.exit_status = "Submitted"
            return
        self.messages.append({"role": "user", "content": observation_text(self.cfg, output)})
