"""Codex CLI's sub-agents, trained: recorded, assembled as their own segments, none dropped.

Codex 0.169 offers its sub-agent tools as one Responses `namespace` tool (`multi_agent_v1`:
spawn_agent, wait_agent, send_input, resume_agent, close_agent). Fast: the proxy flattens a
namespace for the policy and sends a call to one of its functions back with its
`namespace` (official `openai` client, streamed and not), and the replayed call extends the
same segment; a function name in two places is a clear 400; the recorded bodies
(tests/fixtures/harness_requests/codex-subagents.json: the parent's first call, the
sub-agent's first call, the parent's call after the spawn) still parse and carry what
docs/harnesses.md says; the oracle's delegation plan (spawn, wait, report) through them.
Slow (the real binary in a sandbox, the production rollout path, both backends): the
oracle's parent spawns a sub-agent that runs the four steps in the sandbox; the task
resolves, the sub-agent's turns are their own segment beside the parent's unbroken chain,
both packed for the loss under the rollout's advantage, no side call, delivered fraction 1.0;
on the local backend under strace, nothing but the proxy is reached. Forced compaction (a
limit the sub-agent crosses and the parent does not): the sub-agent's summary is a side
call, its turns before and after are two segments, delivered fraction still 1.0. The
parent's sub-agent calls count toward the adapter's `max_turns`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest

from legorl.engine.oracle import DELEGATED, MARK, OraclePolicy, OracleTask
from legorl.harness.install import is_built
from legorl.harness.nettrace import NetTraced
from legorl.proxy import responses
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.server import ProxyServer
from legorl.proxy.toolcalls import parse_completion
from legorl.train.batch import pack
from legorl.trajectory import assemble, delivered
from legorl.types import Status
from tests.helpers.atif_util import exported_and_valid, store_records
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
from tests.helpers.proxy_util import ProxyScript, tokenizer

FIXTURE = FIXTURES / "harness_requests" / "codex-subagents.json"
NS = "multi_agent_v1"
SPAWN = {
    "type": "function",
    "name": "spawn_agent",
    "description": "Spawn a sub-agent for a well-scoped task.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "additionalProperties": False},
}
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command in a PTY.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
TOOLS = [EXEC, {"type": "namespace", "name": NS, "description": "Tools for sub-agents.", "tools": [SPAWN]}]
SCRIPT = [
    "<think>\nDelegate.\n</think>\n\n"
    '<tool_call>\n{"name": "spawn_agent", "arguments": {"message": "fix it"}}\n</tool_call>',
    '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "git diff"}}\n</tool_call>',
    "Done.",
]


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(body["client_metadata"]["x-codex-turn-metadata"])


@pytest.fixture
def proxy_script() -> ProxyScript:
    return ProxyScript(SCRIPT)


@pytest.mark.parametrize("stream", [False, True])
async def test_namespaced_call_goes_back_with_its_namespace(proxy: ProxyServer, stream: bool) -> None:
    sid = f"ns-{stream}"
    proxy.open_session(sid)
    client = openai.AsyncOpenAI(base_url=proxy.session_url(sid) + "/v1", api_key="x", max_retries=0)
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the bug."}]},
    ]
    kw: dict[str, Any] = {"model": "legorl-policy", "tools": TOOLS, "store": False, "include": [responses.ENCRYPTED]}
    calls = []
    for _ in range(3):
        if stream:
            added, final = [], None
            async for ev in await client.responses.create(input=items, stream=True, **kw):
                if ev.type == "response.output_item.added" and ev.item.type == "function_call":
                    added.append(ev.item)
                final = ev.response if ev.type == "response.completed" else final
            assert final is not None
            r = final
            assert [(a.name, a.namespace) for a in added] == [
                (o.name, o.namespace) for o in r.output if o.type == "function_call"
            ]
        else:
            r = await client.responses.create(input=items, **kw)
        items += [o.model_dump(exclude_none=True) for o in r.output]  # the call back with its namespace
        for o in r.output:
            if o.type == "function_call":
                calls.append((o.name, o.namespace))
                items.append({"type": "function_call_output", "call_id": o.call_id, "output": "ok"})
    assert calls == [("spawn_agent", NS), ("exec_command", None)] and r.output_text == "Done."
    turns = proxy.close_session(sid)
    traj = assemble(turns)
    assert len(traj.segments) == 1, f"the namespaced call did not come back as sampled: {traj.stats}"
    assert delivered(turns, traj)["fraction"] == 1.0


async def test_a_name_in_two_places_is_a_clear_400(proxy: ProxyServer) -> None:
    proxy.open_session("dup")
    client = openai.AsyncOpenAI(base_url=proxy.session_url("dup") + "/v1", api_key="x", max_retries=0)
    twice = [*TOOLS, {"type": "namespace", "name": "other", "description": "d", "tools": [SPAWN]}]
    with pytest.raises(openai.BadRequestError, match=r"tools\[2\]\.tools\[0\]\.name: 'spawn_agent' is also tools\[1\]"):
        await client.responses.create(model="m", input="hi", tools=twice)
    hosted = [{"type": "namespace", "name": "n", "description": "d", "tools": [{"type": "web_search"}]}]
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.tools\[0\]\.type 'web_search'"):
        await client.responses.create(model="m", input="hi", tools=hosted)


def test_recorded_bodies_carry_the_sub_agent_namespace() -> None:
    parent, child, after = json.loads(FIXTURE.read_text())["requests"]
    (ns,) = [t for t in parent["tools"] if t["type"] == "namespace"]
    assert ns["name"] == NS and {t["name"] for t in ns["tools"]} >= {"spawn_agent", "wait_agent", "close_agent"}
    names = [t["function"]["name"] for t in responses.parse(parent).chat.tools]
    assert "exec_command" in names and "spawn_agent" in names and "wait_agent" in names
    # the sub-agent: the same provider (the same session), its own thread, no sub-agent tools (depth 1)
    assert _metadata(child)["thread_source"] == "subagent" and _metadata(parent)["thread_source"] == "user"
    assert child["client_metadata"]["thread_id"] != parent["client_metadata"]["thread_id"]
    assert all(t["type"] == "function" for t in child["tools"])
    assert DELEGATED in json.dumps(child["input"][-1])  # its prompt: the parent's spawn_agent message
    # the parent's call comes back with its namespace; the answer is the agent's id at once
    call = next(i for i in after["input"] if i.get("type") == "function_call")
    assert call["namespace"] == NS and call["name"] == "spawn_agent"
    assert set(json.loads(after["input"][-1]["output"])) == {"agent_id", "nickname"}
    msgs = responses.parse(after).chat.messages
    assert msgs[-2]["tool_calls"][0]["function"]["name"] == "spawn_agent"


def test_oracle_delegates_through_codex_tools() -> None:
    """spawn_agent {message} → wait_agent {targets: [its id]} → the report; the sub-agent,
    offered no spawn tool, does the four steps with exec_command."""
    parent, child, after = json.loads(FIXTURE.read_text())["requests"]
    task = shipped(1)[0]
    oracle_task = OracleTask(task.instance_id, task.problem_statement, task.patch)
    policy = OraclePolicy({task.instance_id: oracle_task}, delegate=True)
    renderer = ChatMLRenderer(tokenizer())

    def act(body: dict[str, Any]) -> Any:
        chat = responses.parse(body).chat
        return parse_completion(policy.complete(renderer.decode(renderer.render(chat))))

    (spawn,) = act(parent).tool_calls
    assert spawn.name == "spawn_agent" and DELEGATED in json.loads(spawn.arguments)["message"]
    (wait,) = act(after).tool_calls
    agent_id = json.loads(after["input"][-1]["output"])["agent_id"]
    assert wait.name == "wait_agent" and json.loads(wait.arguments)["targets"] == [agent_id]
    report = {"status": {agent_id: {"completed": f"Fixed. {MARK}:step-4"}}, "timed_out": False}
    done = dict(after, input=[*after["input"], *_call_items(wait, json.dumps(report))])
    final = act(done)
    assert not final.tool_calls and f"{MARK}:step-4" in final.content
    (first,) = act(child).tool_calls
    assert first.name == "exec_command" and f"{MARK}:step-1" in json.loads(first.arguments)["cmd"]


def _call_items(call: Any, output: str) -> list[dict[str, Any]]:
    return [
        {"type": "function_call", "call_id": call.id, "name": call.name, "namespace": NS, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.id, "output": output},
    ]


_calibration: dict[str, Any] = {}  # "codex" -> a finished delegated rollout (prompt sizes per turn)


def _need_codex() -> None:
    if why := harness_missing("codex"):
        pytest.fail(why)  # CI installs the layers; a missing one is a broken set-up, not a skip


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_sub_agent_is_its_own_segment(backend: str, tmp_path: Path) -> None:
    _need_codex()
    if backend == "docker" and (why := docker_missing()):
        pytest.fail(why)
    traced = backend == "local" and is_built("strace")  # and only the proxy reached, with a sub-agent running
    setup = Setup("codex", backend=backend, engine_options={"delegate": True})
    rec = asyncio.run(rollouts(setup, shipped(1), wrap=NetTraced if traced else None))[0]
    _calibration.setdefault("codex", rec)
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.RESOLVED and o.reward == 1.0, summary(rec)
    check_recorded(rec)
    details = rec.result.agent.details
    assert details["sub_agents"] == "1" and details["tool_calls"] == "2", summary(rec)  # spawn, wait
    if traced:
        assert int(details["net_attempts"]) > 0 and details["net_foreign"] == "", details
    assert rec.trajectory.side_turns == [], summary(rec)
    sources = {t.index: _metadata(t.request)["thread_source"] for t in rec.turns}
    segs = [s.turn_indices for s in rec.trajectory.segments]
    assert len(segs) == 2, summary(rec)
    parent, child = sorted(segs, key=lambda s: sources[s[0]] == "subagent")
    assert {sources[i] for i in parent} == {"user"} and {sources[i] for i in child} == {"subagent"}, segs
    assert parent[0] == 0 and len(child) == 4 and child[0] > 0, segs  # inspect, patch, test, report
    assert delivered(rec.turns, rec.trajectory)["fraction"] == 1.0
    # trained with the rollout's outcome: both segments packed, every sampled token under its advantage
    (mb,) = pack([(0, rec.trajectory, 0.75)], "segment", 1 << 20)
    assert mb.segment_lengths == [len(s.token_ids) for s in rec.trajectory.segments]
    assert int(mb.mask_N.sum()) == sum(sum(s.loss_mask[1:]) for s in rec.trajectory.segments) > 0
    assert bool((mb.advantages_N[mb.mask_N > 0] == 0.75).all())
    # exported as ATIF (Harbor's validator accepts it): the sub-agent embedded, the parent the root
    (doc,) = exported_and_valid(store_records(tmp_path / "run", [rec]), tmp_path / "atif")
    (sub,) = doc["subagent_trajectories"]
    sub_turns = [s["extra"]["legorl"]["turn_index"] for s in sub["steps"] if "metrics" in s]
    assert sub_turns == child and sub["trajectory_id"] != doc["trajectory_id"], sub_turns


@pytest.mark.harness
@pytest.mark.slow
def test_sub_agent_compaction_keeps_every_sampled_token(tmp_path: Path) -> None:
    """Codex's auto-compaction limit placed between the sub-agent's third turn and its
    fourth prompt (the test output lies between; the parent never gets there): the
    sub-agent compacts (a side call of its thread) and goes on in a new segment; it
    resolves and no sampled token is lost."""
    _need_codex()
    if "codex" not in _calibration:
        _calibration["codex"] = asyncio.run(rollouts(Setup("codex", engine_options={"delegate": True}), shipped(1)))[0]
    calib = _calibration["codex"]
    child = [t for t in calib.turns if _metadata(t.request)["thread_source"] == "subagent"]
    prev, cur = child[-2], child[-1]
    lo, hi = len(prev.prompt_ids) + len(prev.completion_ids), len(cur.prompt_ids)
    parent_max = max(len(t.prompt_ids) + len(t.completion_ids) for t in calib.turns if t not in child)
    assert hi - lo > 1000 and parent_max < (lo + hi) // 2, (lo, hi, parent_max)
    options = {"auto_compact_limit": (lo + hi) // 2}
    setup = Setup("codex", engine_options={"delegate": True}, options=options)
    rec = asyncio.run(rollouts(setup, shipped(1)))[0]
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.RESOLVED and o.reward == 1.0, summary(rec)
    check_recorded(rec)
    side = [t for t in rec.turns if t.side_call]
    assert len(side) == 1 and side[0].completion_ids and not side[0].request.get("tools"), summary(rec)
    assert _metadata(side[0].request)["thread_source"] == "subagent", summary(rec)
    assert rec.trajectory.side_turns == [side[0].index], summary(rec)
    sources = {t.index: _metadata(t.request)["thread_source"] for t in rec.turns}
    segs = [s.turn_indices for s in rec.trajectory.segments]
    assert len([s for s in segs if sources[s[0]] == "subagent"]) == 2, segs  # before and after its summary
    assert len([s for s in segs if sources[s[0]] == "user"]) == 1, segs  # the parent's chain unbroken
    assert delivered(rec.turns, rec.trajectory)["fraction"] == 1.0
    # exported as ATIF (Harbor's validator accepts it): both sub-agent segments embedded, the summary marked
    (doc,) = exported_and_valid(store_records(tmp_path / "run", [rec]), tmp_path / "atif")
    assert len(doc["subagent_trajectories"]) == 2
    marked = [
        s["extra"]["legorl"]["turn_index"]
        for s in doc["steps"]
        if s.get("extra", {}).get("legorl", {}).get("side_call")
    ]
    assert marked == [side[0].index], marked


@pytest.mark.harness
@pytest.mark.slow
def test_sub_agent_calls_count_toward_max_turns() -> None:
    """The parent's `spawn_agent` is a tool call of the turn limit (a `collab_tool_call`
    item in the events): at `max_turns=1` the run stops there → `max_turns`, not a hang."""
    _need_codex()
    setup = Setup("codex", max_turns=1, timeout_s=300, engine_options={"delegate": True})
    rec = asyncio.run(rollouts(setup, shipped(1)))[0]
    o = rec.trajectory.outcome
    assert o is not None and o.status is Status.MAX_TURNS and not o.masked, summary(rec)
    details = rec.result.agent.details
    assert details["tool_calls"] == "1" and details["sub_agents"] == "1" and not rec.result.agent.timed_out, details
