"""Each harness's action format: declared by its adapter, recorded in the run store, and the
rule that says whether a turn parsed (mini-swe-agent's own: exactly one fenced block)."""

from __future__ import annotations

from pathlib import Path

import pytest

from legorl.harness.actions import (
    MINI_ACTION_REGEX,
    MINI_BASH_TOOL,
    TOOL_CALLS,
    ActionFormat,
    format_of,
    mini_format,
    text_block,
)
from legorl.harness.command import CommandHarness
from legorl.harness.registry import HARNESSES, action_format
from legorl.loop.config import load_run_config
from legorl.loop.startup import record_action_format
from legorl.quickstart.expert import FENCE, SUBMIT
from legorl.store.run_store import RunStore
from legorl.types import Dialect, FinishReason, Turn
from tests.helpers.paths import ROOT

EXAMPLES = ROOT / "examples"


def turn(text: str = "", calls: list[str] | None = None, format_error: bool = False) -> Turn:
    return Turn(
        session_id="s",
        index=0,
        dialect=Dialect.OPENAI_CHAT,
        prompt_ids=[1],
        completion_ids=[2],
        logprobs=[-0.1],
        finish_reason=FinishReason.STOP,
        sampling_used={},
        response_text=text,
        tool_calls=[{"id": f"c{i}", "name": n, "arguments": "{}"} for i, n in enumerate(calls or [])],
        format_error=format_error,
    )


def test_every_registered_harness_declares_its_action_format() -> None:
    for name in HARNESSES:
        assert isinstance(action_format(name), ActionFormat), name
    assert format_of(CommandHarness("true")) == TOOL_CALLS
    assert action_format("mini-swe-agent") == MINI_BASH_TOOL  # the CLI runs mini.yaml: bash tool calls
    assert action_format("mini-swe-agent-warm") == MINI_BASH_TOOL  # "" is mini.yaml too
    quick = action_format("mini-swe-agent-warm", config="quickstart")  # litellm_textbased
    assert quick.kind == "text_block" and quick.pattern == MINI_ACTION_REGEX
    assert quick.label == "one ```mswea_bash_command block"
    with pytest.raises(TypeError, match="declares no action_format"):
        format_of(object())


def test_text_block_follows_mini_swe_agents_exactly_one_rule() -> None:
    fmt = mini_format({"model": {"model_class": "litellm_textbased"}})
    one = FENCE.format(f"python3 test_calc.py && {SUBMIT}")
    assert fmt.parses(turn(f"I will run the tests.\n{one}")) and fmt.acts(turn(one))
    assert not fmt.parses(turn("I think the bug is in add."))  # no block: mini's FormatError
    assert not fmt.parses(turn(one + "\n" + one))  # two blocks: "Expected exactly 1 action, found 2"
    assert not fmt.parses(turn("```bash\nls\n```"))  # another fence is not this config's action
    assert fmt.parses(turn(f"<think>maybe {one} or {one}</think>{one}"))  # reasoning is not content
    # a tool call the proxy parsed is no action for a text-based agent; a malformed one no failure
    assert not fmt.parses(turn("", calls=["bash"]))
    assert fmt.parses(turn(one, format_error=True))
    backticks = text_block(r"```bash\s*\n(.*?)\n```")
    assert backticks.label == "one ```bash block" and backticks.parses(turn("```bash\nls\n```"))
    xml = mini_format({"model": {"model_class": "litellm_textbased", "action_regex": "<cmd>(.*?)</cmd>"}})
    assert xml.label == "one <cmd> block" and xml.parses(turn("<cmd>ls</cmd>"))


def test_tool_calls_optional_or_required() -> None:
    assert TOOL_CALLS.parses(turn("All done: the fix is in."))  # Claude Code ends in prose
    assert not TOOL_CALLS.acts(turn("All done."))
    assert TOOL_CALLS.acts(turn("", calls=["Bash"]))
    assert not TOOL_CALLS.parses(turn('<tool_call>{"name": "Bash", "argu', format_error=True))
    assert MINI_BASH_TOOL.parses(turn("", calls=["bash", "bash"]))
    assert not MINI_BASH_TOOL.parses(turn("Let me think."))  # mini: "No tool calls found"
    assert not MINI_BASH_TOOL.parses(turn("", calls=["python"]))  # mini: "Unknown tool"


def test_formats_round_trip_and_bad_ones_are_named() -> None:
    for fmt in (TOOL_CALLS, MINI_BASH_TOOL, text_block()):
        assert ActionFormat.from_dict(fmt.to_dict()) == fmt
    with pytest.raises(ValueError, match="unknown action format kind 'regex'"):
        ActionFormat.from_dict({"kind": "regex"})


def test_train_records_the_configured_harness_format_in_the_run_store(tmp_path: Path) -> None:
    cfg = load_run_config(EXAMPLES / "quickstart.toml")
    with RunStore(tmp_path / "run") as store:
        assert store.action_formats() == {}
        record_action_format(store, cfg)
        store.set_action_formats({"claude-code": TOOL_CALLS})  # merged, not replaced
    with RunStore(tmp_path / "run", readonly=True) as store:
        formats = store.action_formats()
    assert formats == {"mini-swe-agent-warm": text_block(), "claude-code": TOOL_CALLS}


@pytest.mark.harness
def test_text_block_agrees_with_the_installed_mini_swe_agent() -> None:
    """Our reading of a turn against mini-swe-agent's own parser (`parse_regex_actions`, run by
    the harness layer's interpreter) and its own config defaults."""
    import json
    import os
    import subprocess

    from legorl.harness.warm_mini import builtin_config, mini_python

    texts = [
        FENCE.format("ls"),
        "Let me look.\n" + FENCE.format("cat calc.py"),
        FENCE.format("ls") + "\n" + FENCE.format("pwd"),
        "no block at all",
        "```bash\nls\n```",
        "```mswea_bash_command\nls```",  # the closing fence must start a line
        "```mswea_bash_command   \nls -la\n```\ntrailing prose",
    ]
    probe = (  # the config class's default read from its source: importing it loads LiteLLM (tens of seconds)
        "import ast, json, sys\n"
        "import minisweagent.models as m\n"
        "from minisweagent.exceptions import FormatError\n"
        "from minisweagent.models.utils.actions_text import parse_regex_actions\n"
        "src = open(m.__path__[0] + '/litellm_textbased_model.py').read()\n"
        "regex = next(ast.literal_eval(n.value) for n in ast.walk(ast.parse(src))\n"
        "             if isinstance(n, ast.AnnAssign) and getattr(n.target, 'id', '') == 'action_regex')\n"
        "out = []\n"
        "for t in json.load(sys.stdin):\n"
        "    try:\n"
        "        parse_regex_actions(t, action_regex=regex, format_error_template='{{error}}'); out.append(True)\n"
        "    except FormatError:\n"
        "        out.append(False)\n"
        "print(json.dumps({'regex': regex, 'parsed': out}))\n"
    )
    env = {**os.environ, "MSWEA_SILENT_STARTUP": "1", "MSWEA_CONFIGURED": "true"}
    run = subprocess.run(
        [str(mini_python()), "-c", probe], input=json.dumps(texts), capture_output=True, text=True, timeout=120, env=env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    assert theirs["regex"] == MINI_ACTION_REGEX
    fmt = text_block()
    assert [fmt.parses(turn(t)) for t in texts] == theirs["parsed"]
    assert theirs["parsed"] == [True, True, False, False, False, False, True]
    import yaml

    for name in ("mini.yaml", "mini_textbased.yaml"):  # neither names a model class: LiteLLM's tool-call model
        assert mini_format(yaml.safe_load(builtin_config(name).read_text())) == MINI_BASH_TOOL, name
    path = "minisweagent.models.litellm_textbased_model.LitellmTextbasedModel"
    assert mini_format({"model": {"model_class": path}}) == text_block()
