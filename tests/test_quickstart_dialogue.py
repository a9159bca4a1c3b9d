"""mini-swe-agent's text-based loop as the in-process path plays it, and the statistics."""

from __future__ import annotations

import math

import pytest

from legorl.quickstart.dialogue import Dialogue, load_agent_config, parse_actions
from legorl.quickstart.evaluate import newcombe_diff, summarize, table, wilson
from legorl.quickstart.family import PROBLEM

FIX = "```mswea_bash_command\nsed -i 's|^def add.*|def add(a, b): return a + b|' calc.py && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


@pytest.fixture()
def cfg() -> dict:
    return load_agent_config()


def test_messages_come_from_the_yaml(cfg: dict) -> None:
    d = Dialogue(cfg, PROBLEM)
    assert [m["role"] for m in d.messages] == ["system", "user"]
    assert d.messages[0]["content"] == cfg["agent"]["system_template"]
    assert d.messages[1]["content"] == PROBLEM


def test_a_command_then_its_observation_then_submission(cfg: dict) -> None:
    d = Dialogue(cfg, PROBLEM)
    assert d.wants_query()
    assert d.on_reply("```mswea_bash_command\npython test_calc.py\n```", "stop") == "python test_calc.py"
    d.on_output({"output": "PASS add\n", "returncode": 1, "exception_info": ""})
    assert d.messages[-1] == {"role": "user", "content": "<returncode>1</returncode>\n<output>\nPASS add\n</output>"}
    assert d.on_reply(FIX, "stop").startswith("sed -i")
    d.on_output({"output": "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", "returncode": 0, "exception_info": ""})
    assert d.done and d.exit_status == "Submitted" and not d.wants_query()


def test_the_marker_only_submits_with_exit_code_zero(cfg: dict) -> None:
    d = Dialogue(cfg, PROBLEM)
    d.on_reply(FIX, "stop")
    d.on_output({"output": "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", "returncode": 1, "exception_info": ""})
    assert not d.done


def test_format_errors_are_not_kept_in_history_and_end_the_run(cfg: dict) -> None:
    d = Dialogue(cfg, PROBLEM)
    assert d.on_reply("no block here", "length") is None
    assert d.messages[-1]["role"] == "user" and "Expected exactly 1 action, found 0." in d.messages[-1]["content"]
    assert len(d.messages) == 3  # mini-swe-agent drops the malformed reply itself
    assert not d.done
    assert d.on_reply(FIX + "\n" + FIX, "stop") is None  # two actions: also a format error
    assert d.exit_status == "RepeatedFormatError"


def test_step_limit(cfg: dict) -> None:
    d = Dialogue(cfg, PROBLEM)
    for _ in range(int(cfg["agent"]["step_limit"])):
        assert d.wants_query()
        d.on_reply("```mswea_bash_command\nls\n```", "stop")
        d.on_output({"output": "", "returncode": 0, "exception_info": ""})
    assert not d.wants_query() and d.exit_status == "LimitsExceeded"


def test_action_regex_needs_the_fence_language(cfg: dict) -> None:
    assert parse_actions(cfg, "```bash\nls\n```") == []
    assert parse_actions(cfg, "thinking...\n```mswea_bash_command\nls -la\n```") == ["ls -la"]


def test_wilson_and_newcombe_match_published_values() -> None:
    low, high = wilson(56, 70)  # Newcombe (1998), table I: 0.6918–0.8770
    assert math.isclose(low, 0.6918, abs_tol=1e-4) and math.isclose(high, 0.8770, abs_tol=1e-4)
    assert wilson(0, 300)[0] < 1e-12 and math.isclose(wilson(0, 300)[1], 0.01264, abs_tol=1e-4)
    d, lo, hi = newcombe_diff(48, 80, 56, 70)  # Newcombe (1998), method 10: 0.0524 to 0.3339
    assert math.isclose(d, 0.2) and math.isclose(lo, 0.0524, abs_tol=1e-4) and math.isclose(hi, 0.3339, abs_tol=1e-4)
    with pytest.raises(ValueError):
        wilson(0, 0)


def test_summary_and_table() -> None:
    ev = summarize("after SFT", [(True, "resolved", "failing"), (False, "failed", "first")] * 5, 3.0, "in-process")
    d = ev.as_dict()
    assert d["resolved"] == 5 and d["episodes"] == 10 and d["resolved_rate"] == 0.5
    assert d["choices"] == {"failing": 5, "first": 5} and d["ci95"][0] < 0.5 < d["ci95"][1]
    assert "after SFT" in table([ev]) and "50.0%" in table([ev])
