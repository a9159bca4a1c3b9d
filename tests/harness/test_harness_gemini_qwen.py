"""Gemini CLI (the Gemini API dialect) and Qwen Code (OpenAI chat): recorded request bodies,
how each run ends, and the oracle resolving a shipped task through the real harness on
both sandbox backends.

The fixtures (`tests/fixtures/harness_requests/`) are the second model call of an oracle
rollout as each harness sent it (the proxy's `record_request`): they pin what the proxy
must accept and how it reads them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from legorl.engine.oracle import find_shell
from legorl.harness.base import run_native
from legorl.harness.gemini_cli import GeminiCli
from legorl.harness.qwen_code import QwenCode
from legorl.harness.registry import make_harness
from legorl.proxy import gemini, openai_chat
from legorl.sandbox.base import ExecResult
from legorl.types import Status, Task
from tests.helpers.harness_util import (
    Setup,
    check_recorded,
    docker_missing,
    harness_missing,
    rollouts,
    shipped,
    summary,
)
from tests.helpers.paths import FIXTURES

FIXTURES = FIXTURES / "harness_requests"
HARNESSES = ["gemini-cli", "qwen-code"]


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_recorded_gemini_cli_request_is_read_as_a_tool_conversation() -> None:
    body = _fixture("gemini-cli")
    assert "functionDeclarations" in body["tools"][0] and body["generationConfig"]["thinkingConfig"]
    p = gemini.parse_request(body, "legorl-policy", True)
    roles = [m["role"] for m in p.chat.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    call = p.chat.messages[2]["tool_calls"][0]
    assert p.chat.messages[3]["tool_call_id"] == call["id"]  # functionResponse.id pairs with functionCall.id
    assert p.chat.messages[3]["content"].startswith("<untrusted_context>")  # the `output` string, not its JSON
    assert p.requested == {"temperature": 1, "top_p": 0.95, "top_k": 64}
    tools = [t["function"] for t in p.chat.tools]
    assert find_shell(tools)["name"] == "run_shell_command"  # the oracle drives its shell tool
    assert all(t["parameters"].get("type") == "object" for t in tools)


def test_recorded_qwen_code_request_is_read_as_a_tool_conversation() -> None:
    body = _fixture("qwen-code")
    p = openai_chat.parse(body)
    assert [m["role"] for m in p.chat.messages][-2:] == ["assistant", "tool"] and p.stream
    assert find_shell([t["function"] for t in p.chat.tools])["name"] == "run_shell_command"


def _res(code: int = 0) -> ExecResult:
    return ExecResult(exit_code=code, stdout="", stderr="", duration_s=1.0)


@pytest.mark.parametrize(
    ("events", "code", "status"),
    [
        ([{"type": "init"}, {"type": "result", "status": "success", "stats": {}}], 0, None),
        ([{"type": "init"}], 53, Status.MAX_TURNS),
        (
            [
                {
                    "type": "result",
                    "status": "error",
                    "error": {"type": "Error", "message": "[API Error: got status: 502 Bad Gateway]"},
                }
            ],
            1,
            Status.ENGINE_ERROR,
        ),
        (
            [
                {
                    "type": "result",
                    "status": "error",
                    "error": {
                        "message": "The input token count (40000) exceeds the maximum number of tokens allowed (32768)."
                    },
                }
            ],
            1,
            None,
        ),
        ([{"type": "result", "status": "error", "error": {"message": "status: 400 bad field"}}], 1, Status.INFRA_ERROR),
        ([], 1, Status.INFRA_ERROR),
    ],
)
def test_gemini_cli_endings(events: list, code: int, status: Status | None) -> None:
    out = {"events": "\n".join(json.dumps(e) for e in events), "stderr": "boom"}
    v = GeminiCli().interpret(_res(code), out, None)  # type: ignore[arg-type]
    assert v.status is status, v


@pytest.mark.parametrize(
    ("result", "code", "status"),
    [
        ({"type": "result", "subtype": "success", "is_error": False, "num_turns": 3}, 0, None),
        ({"type": "result", "subtype": "error_max_turns", "is_error": True}, 1, Status.MAX_TURNS),
        (
            {
                "type": "result",
                "subtype": "error_during_execution",
                "is_error": True,
                "error": {"message": "Connection error. (cause: fetch failed)"},
            },
            1,
            Status.ENGINE_ERROR,
        ),
        (None, 1, Status.INFRA_ERROR),
    ],
)
def test_qwen_code_endings(result: dict | None, code: int, status: Status | None) -> None:
    out = {"events": json.dumps(result) if result else "", "stderr": ""}
    assert QwenCode().interpret(_res(code), out, None).status is status  # type: ignore[arg-type]


@pytest.mark.parametrize("harness", HARNESSES)
async def test_not_installed_is_one_clear_message(
    harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEGORL_HARNESS_ROOT", str(tmp_path))
    adapter = make_harness(harness)
    run = await run_native(
        adapter, None, Task("t", "repo", "base", "fix it", "", "", [], []), "http://127.0.0.1:1/s/x", "/repo", 10
    )  # type: ignore[arg-type]
    assert run.status is Status.INFRA_ERROR
    assert "not installed" in run.details["error"] and "setup_harnesses.sh" in run.details["error"]


# -- the real harnesses, oracle-driven -------------------------------------------------------
def _need(harness: str) -> None:
    why = harness_missing(harness)
    if why:
        pytest.fail(why)  # CI installs the layers; a missing one is a broken set-up, not a skip


def _assert_resolved(rec, harness: str) -> None:
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.RESOLVED and o.reward == 1.0, summary(rec)
    check_recorded(rec)
    main = [t for t in rec.turns if not t.side_call]
    assert main[0].dialect == ("gemini" if harness == "gemini-cli" else "openai_chat")
    # Any side call is the harness's own compaction (Qwen Code's prompt is ~27k tokens of the
    # 32k window), answered by the oracle and marked; Gemini CLI drops thought parts from its
    # history, so each of its turns starts a segment.
    assert all(t.completion_ids and not t.request.get("tools") for t in rec.turns if t.side_call), summary(rec)


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARNESSES)
def test_oracle_resolves_a_shipped_task_locally(harness: str) -> None:
    _need(harness)
    rec = asyncio.run(rollouts(Setup(harness), shipped(1)))[0]
    _assert_resolved(rec, harness)


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("harness", HARNESSES)
def test_oracle_resolves_a_shipped_task_on_docker(harness: str) -> None:
    _need(harness)
    why = docker_missing()
    if why:
        pytest.fail(why)
    rec = asyncio.run(rollouts(Setup(harness, backend="docker"), shipped(1)))[0]
    _assert_resolved(rec, harness)


@pytest.mark.harness
@pytest.mark.slow
def test_a_harness_past_its_time_is_an_agent_timeout() -> None:
    """A model call that never returns (the oracle answers after 120 s): the wall-clock limit
    ends the harness → `agent_timeout`, not masked. (A short limit alone is not a hang: idle,
    Gemini CLI resolves the task in ~2 s.)"""
    _need("gemini-cli")
    setup = Setup("gemini-cli", timeout_s=20, engine_options={"latency_s": 120})  # the call reaches the session
    rec = asyncio.run(rollouts(setup, shipped(1)))[0]
    assert rec.result.agent is not None and rec.result.agent.status is Status.AGENT_TIMEOUT, summary(rec)
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.AGENT_TIMEOUT and not o.masked, summary(rec)


@pytest.mark.harness
@pytest.mark.slow
def test_gemini_cli_context_overflow_is_graded() -> None:
    """Gemini CLI cannot compress a one-prompt run (below): the proxy's honest 400 ends it,
    graded as the policy's doing (its context grew too long), not masked."""
    _need("gemini-cli")
    rec = asyncio.run(rollouts(Setup("gemini-cli", max_context=20_000, timeout_s=200), shipped(1)))[0]
    agent = rec.result.agent
    assert agent is not None and agent.status is None and agent.details.get("context_exhausted") == "1", summary(rec)
    o = rec.trajectory.outcome
    assert o is not None and not o.masked and o.status is not Status.INFRA_ERROR, summary(rec)
    check_recorded(rec)
