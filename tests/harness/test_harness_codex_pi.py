"""Codex CLI and Pi: their recorded request bodies, their config, and real runs.

Fast: the request bodies each harness sent in an oracle rollout (tests/fixtures/
harness_requests/, recorded by the proxy) still parse in the dialect it speaks (Codex: the
Responses API; Pi: chat completions), carry what docs/harnesses.md says they carry, and
the oracle finds the shell tool in them; a missing layer and a bad option are one clear
error. Slow (real binaries from their layers, in sandboxes, through the production rollout
path as in test_harness_e2e.py): the oracle resolves two shipped tasks on the local backend
and one on docker; each compacts (Codex at `auto_compact_limit`, Pi on the proxy's honest
overflow error) with every sampled token kept; the adapter's turn limit stops a run as
`max_turns`; a hung model call is `agent_timeout`; the tiny random `hf` model ends as an
agent failure; a dead engine is a masked `infra_error`.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from legorl.engine.oracle import command_key, find_shell
from legorl.harness.install import HarnessNotInstalled
from legorl.harness.registry import make_harness
from legorl.proxy import openai_chat, responses
from legorl.types import Status
from tests.helpers.harness_util import (
    BrokenEngine,
    Setup,
    check_recorded,
    docker_missing,
    harness_missing,
    prompt_window_between,
    rollouts,
    shipped,
    summary,
)
from tests.helpers.paths import FIXTURES

FIXTURES = FIXTURES / "harness_requests"
HARNESSES = ["codex", "pi"]


def _requests(harness: str) -> list[dict]:
    return json.loads((FIXTURES / f"{harness}.json").read_text())["requests"]


def test_codex_bodies_parse_as_responses() -> None:
    first, second = _requests("codex")
    for body in (first, second):
        assert body["stream"] is True and body["store"] is False
        assert body["include"] == ["reasoning.encrypted_content"] and "previous_response_id" not in body
        parsed = responses.parse(body)
        assert parsed.stream and parsed.chat.messages[0]["role"] == "system"  # developer -> system
        tools = [t["function"] for t in parsed.chat.tools]
        shell = find_shell(tools)
        assert shell is not None and shell["name"] == "exec_command" and command_key(shell) == "cmd"
    assert all(t["type"] == "function" for t in first["tools"])  # web search and sub-agents are off
    # The reasoning Codex got back comes back as a reasoning item's content, before the call.
    kinds = [i.get("type") for i in second["input"][len(first["input"]) :]]
    assert kinds == ["reasoning", "message", "function_call", "function_call_output"]
    msgs = responses.parse(second).chat.messages
    assert any(m.get("reasoning_content") and m.get("tool_calls") for m in msgs)


def test_pi_bodies_parse_as_chat() -> None:
    first, second = _requests("pi")
    for body in (first, second):
        assert body["stream"] is True and body["messages"][0]["role"] == "system"
        parsed = openai_chat.parse(body)
        shell = find_shell([t["function"] for t in parsed.chat.tools])
        assert shell is not None and shell["name"] == "bash" and command_key(shell) == "command"
    replayed = [m for m in second["messages"] if m["role"] == "assistant"]
    assert replayed and all(m.get("reasoning_content") and m.get("tool_calls") for m in replayed)


def test_oracle_plan_through_codex_tools() -> None:
    """The oracle drives Codex's `exec_command {cmd}` (not `command`) through all its steps."""
    from legorl.engine.oracle import MARK, OraclePolicy, OracleTask
    from legorl.models import load_tokenizer
    from legorl.proxy.chatml_renderer import ChatMLRenderer
    from legorl.proxy.toolcalls import parse_completion

    first = _requests("codex")[0]
    parsed = responses.parse(first)
    task = shipped(1)[0]
    policy = OraclePolicy({task.instance_id: OracleTask(task.instance_id, task.problem_statement, task.patch)})
    renderer = ChatMLRenderer(load_tokenizer("tiny-qwen3"))
    msgs = list(parsed.chat.messages)
    for step in range(1, 5):
        text = policy.complete(renderer.decode(renderer.render(type(parsed.chat)(msgs, parsed.chat.tools))))
        p = parse_completion(text)
        if step == 4:  # a final answer, no call
            assert not p.tool_calls and f"{MARK}:step-4" in p.content
            break
        (call,) = p.tool_calls
        args = json.loads(call.arguments)
        assert call.name == "exec_command" and set(args) == {"cmd"} and f"{MARK}:step-{step}" in args["cmd"]
        msgs += [
            {
                "role": "assistant",
                "content": p.content,
                "reasoning_content": p.reasoning,
                "tool_calls": [
                    {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": "ok"},
        ]


def test_config_and_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    codex = make_harness("codex", max_turns=5)
    toml = codex.config("http://127.0.0.1:9/s/abc")
    assert 'base_url = "http://127.0.0.1:9/s/abc/v1"' in toml and 'wire_api = "responses"' in toml
    assert 'web_search = "disabled"' in toml and "[analytics]\nenabled = false" in toml
    pi = make_harness("pi")
    provider = pi.models("http://127.0.0.1:9/s/abc")["providers"]["legorl"]
    assert provider["baseUrl"] == "http://127.0.0.1:9/s/abc/v1" and provider["api"] == "openai-completions"
    with pytest.raises(ValueError, match="api 'bogus' is not one of"):
        make_harness("pi", api="bogus")
    with pytest.raises(ValueError, match="unknown option"):
        make_harness("codex", max_turn=3)
    monkeypatch.setenv("LEGORL_HARNESS_ROOT", str(tmp_path))
    for name in HARNESSES:
        with pytest.raises(HarnessNotInstalled, match=rf"harness layer '{name}' is not installed.*setup_harnesses"):
            make_harness(name).launch(shipped(1)[0], "http://127.0.0.1:9", "/repo")


def _need(harness: str) -> None:
    why = harness_missing(harness)
    if why:
        pytest.fail(why)  # CI installs the layers; a missing one is a broken set-up, not a skip


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARNESSES)
def test_oracle_resolves_two_shipped_tasks(harness: str) -> None:
    _need(harness)
    recs = asyncio.run(rollouts(Setup(harness), shipped(2)))
    assert len({r.trajectory.instance_id for r in recs}) == 2
    for rec in recs:
        o = rec.trajectory.outcome
        assert o is not None and o.status is Status.RESOLVED and o.reward == 1.0, summary(rec)
        check_recorded(rec)
        assert len([t for t in rec.turns if not t.side_call]) == 4, summary(rec)  # inspect, patch, test, answer
        assert rec.trajectory.side_turns == [] and len(rec.trajectory.segments) == 1, summary(rec)
        assert rec.result.agent.details["tool_calls"] == "3", summary(rec)


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("harness", HARNESSES)
def test_oracle_on_docker(harness: str) -> None:
    _need(harness)
    why = docker_missing()
    if why:
        pytest.fail(why)
    rec = asyncio.run(rollouts(Setup(harness, backend="docker"), shipped(1)))[0]
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.RESOLVED and o.reward == 1.0, summary(rec)
    check_recorded(rec)


_calibration: dict[str, object] = {}  # harness -> a finished oracle rollout (prompt sizes per turn)


def _calibrated(harness: str) -> Any:  # a RolloutRecord
    if harness not in _calibration:
        _calibration[harness] = asyncio.run(rollouts(Setup(harness), shipped(1)))[0]
    return _calibration[harness]


@pytest.mark.harness
@pytest.mark.slow
def test_codex_compacts_at_its_limit() -> None:
    """Codex's own auto-compaction (a summary request without tools, a side call), placed
    between the end of turn 0 and the prompt of turn 1: it resolves, no token lost."""
    _need("codex")
    limit = prompt_window_between(_calibrated("codex"), 1)
    rec = asyncio.run(rollouts(Setup("codex", options={"auto_compact_limit": limit}), shipped(1)))[0]
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.RESOLVED and o.reward == 1.0, summary(rec)
    check_recorded(rec)
    side = [t for t in rec.turns if t.side_call]
    assert side and all(t.completion_ids and not t.request.get("tools") for t in side), summary(rec)
    assert len(rec.trajectory.segments) >= 2, summary(rec)


@pytest.mark.harness
@pytest.mark.slow
def test_pi_compacts_on_overflow() -> None:
    """The proxy's window ends inside the run: Pi compacts (a side call). In print mode it
    then exits without retrying (its retry is scheduled after the prompt returned), which is
    graded as a normal end with `context_exhausted`, never an infra error."""
    _need("pi")
    window = prompt_window_between(_calibrated("pi"), 3)
    rec = asyncio.run(rollouts(Setup("pi", max_context=window), shipped(1)))[0]
    o = rec.trajectory.outcome
    assert o is not None and not o.status.is_infra and not o.masked, summary(rec)
    assert rec.result.agent.details.get("context_exhausted") == "1", summary(rec)
    check_recorded(rec)
    side = [t for t in rec.turns if t.side_call]
    assert side and all(t.completion_ids and not t.request.get("tools") for t in side), summary(rec)


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARNESSES)
def test_turn_limit_is_max_turns(harness: str) -> None:
    """Neither harness has a step limit: the adapter's (from its events) ends the run."""
    _need(harness)
    rec = asyncio.run(rollouts(Setup(harness, max_turns=2, timeout_s=300), shipped(1)))[0]
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.MAX_TURNS and not o.masked, summary(rec)
    assert rec.result.agent.details["tool_calls"] == "2" and not rec.result.agent.timed_out, summary(rec)


@pytest.mark.harness
@pytest.mark.slow
def test_hang_is_agent_timeout() -> None:
    """A model call that never returns: the wall-clock limit kills the harness and its
    turn-limit wrapper (turn_limit.py, shared by both) at once → `agent_timeout`."""
    _need("codex")
    setup = Setup("codex", timeout_s=20, engine_options={"latency_s": 120})  # the call reaches the session
    t0 = time.monotonic()
    rec = asyncio.run(rollouts(setup, shipped(1)))[0]
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.AGENT_TIMEOUT and not o.masked, summary(rec)
    assert time.monotonic() - t0 < 60, "the harness outlived its timeout"


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARNESSES)
def test_tiny_hf_model_fails_as_the_agent(harness: str) -> None:
    """Garbage answers cut at 48 tokens: an agent failure (Codex gives up on the incomplete
    response → `format_error`; Pi takes the cut text as its answer → `no_patch`), never infra."""
    _need(harness)
    setup = Setup(harness, engine="hf", max_turns=2, max_tokens=48, timeout_s=300)
    rec = asyncio.run(rollouts(setup, shipped(1)))[0]
    o = rec.trajectory.outcome
    assert o is not None and not o.status.is_infra and not o.masked, summary(rec)
    assert o.status in (Status.NO_PATCH, Status.FAILED, Status.MAX_TURNS, Status.FORMAT_ERROR), summary(rec)
    assert o.reward == 0.0 and not rec.result.agent.timed_out
    assert rec.turns and all(len(t.logprobs) == len(t.completion_ids) for t in rec.turns)


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARNESSES)
def test_dead_engine_is_an_infra_error(harness: str) -> None:
    _need(harness)
    engine = BrokenEngine()
    rec = asyncio.run(rollouts(Setup(harness, timeout_s=300), shipped(1), engine=engine))[0]
    o = rec.trajectory.outcome
    assert o is not None and o.status.is_infra and o.masked, summary(rec)
    assert engine.calls >= 1 and rec.trajectory.segments == []
