"""`legorl export --format atif`: one ATIF file per trajectory, accepted by Harbor's own validator.

Harbor (the pinned `harbor` package, in its own Python 3.12 venv: scripts/setup_harbor.sh)
validates every file exported from a demo run (four dialects, compactions, infra errors
without turns) and from sessions with sub-agents: Codex's recorded request bodies (the
sub-agent marked `thread_source: "subagent"`, a compaction side call, the sub-agent going
on in a new segment) and an unmarked Anthropic session whose sub-agent is found by its
interleaving with the parent. The validator is shown to reject a broken file, so a pass
means something. Token ids and logprobs match the store exactly; reading a file back
(`read_turns`) and assembling it gives the store's segments. Bad input: one line, exit != 0.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from legorl.monitor.atif import SCHEMA_VERSION, read_turns
from legorl.monitor.demo import encode, write_demo_run
from legorl.store.run_store import RunStore
from legorl.trajectory import assemble
from legorl.types import Dialect, FinishReason, Outcome, Status, Turn
from tests.helpers.atif_util import LEGORL, ROOT, export, exported_and_valid, harbor_errors
from tests.helpers.paths import FIXTURES

FIXTURE = FIXTURES / "harness_requests" / "codex-subagents.json"


# ----------------------------------------------------------------- sessions with sub-agents
def _lp(rng: random.Random, n: int) -> list[float]:
    return [-(rng.random() ** 2) * 3 for _ in range(n)]


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _turn(sid: str, i: int, dialect: Dialect, prompt: list[int], text: str, request: dict[str, Any], **kw: Any) -> Turn:
    ids, _ = encode(text)
    rng = random.Random(f"{sid}{i}")
    return Turn(
        session_id=sid,
        index=i,
        dialect=dialect,
        prompt_ids=prompt,
        completion_ids=ids,
        logprobs=_lp(rng, len(ids)),
        finish_reason=FinishReason.STOP,
        sampling_used={"temperature": 1.0},
        request=request,
        response_text=text,
        model="legorl-policy",
        t_start=1_796_140_297.0 + i,
        t_end=1_796_140_297.5 + i,
        **kw,
    )


def _record(store: RunStore, sid: str, harness: str, turns: list[Turn]) -> None:
    store.start_session(sid, step=0, instance_id="calc-0001", harness=harness)
    for t in turns:
        store.add_turn(t)
    outcome = Outcome(reward=1.0, status=Status.RESOLVED, tests={"test_calc.py::test_add": "passed"})
    traj = assemble(turns, sid, instance_id="calc-0001", harness=harness, outcome=outcome)
    store.add_trajectory(traj)
    store.set_advantage(sid, 0.5)


def codex_session(store: RunStore, sid: str = "codex-subagents") -> list[Turn]:
    """Codex's recorded bodies: the parent spawns a sub-agent (turns 1, 2), waits (3), the
    sub-agent compacts (side call 4) and goes on in a new segment (5), the parent answers (6)."""
    parent, child, after = json.loads(FIXTURE.read_text())["requests"]
    R = Dialect.RESPONSES

    def more(body: dict[str, Any], *items: dict[str, Any]) -> dict[str, Any]:
        return {**body, "input": [*body["input"], *items]}

    def out(call_id: str, text: str) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": call_id, "output": text}

    spawn, run, wait = (
        _call("call_spawn", "spawn_agent", {"message": "fix it"}),
        _call("call_ls", "exec_command", {"cmd": "ls"}),
        _call("call_wait", "wait_agent", {"targets": ["a1"]}),
    )
    p0, _ = encode("parent: fix the calculator")
    t0 = _turn(sid, 0, R, p0, "I will delegate.", parent, tool_calls=[spawn])
    s0, _ = encode("sub-agent: fix it")
    t1 = _turn(sid, 1, R, s0, "Looking around.", child, tool_calls=[run])
    s1 = s0 + t1.completion_ids + encode("calc.py test_calc.py")[0]
    fc = {"type": "function_call", "call_id": "call_ls", "name": "exec_command", "arguments": '{"cmd": "ls"}'}
    t2 = _turn(sid, 2, R, s1, "Fixed the sign.", more(child, fc, out("call_ls", "calc.py test_calc.py")))
    p1 = p0 + t0.completion_ids + encode('{"agent_id": "a1"}')[0]
    t3 = _turn(sid, 3, R, p1, "Waiting for it.", after, tool_calls=[wait])
    x, _ = encode("Summarize the conversation so far.")
    summary = {**child, "input": [{"type": "message", "role": "user", "content": "Summarize the conversation."}]}
    t4 = _turn(sid, 4, R, x, "Summary: the sign was wrong.", summary, side_call=True)
    s2, _ = encode("Summary: the sign was wrong. Continue.")
    cont = {**child, "input": [{"type": "message", "role": "user", "content": "Summary: the sign was wrong."}]}
    t5 = _turn(sid, 5, R, s2, "All tests pass.", cont)
    p2 = p1 + t3.completion_ids + encode("completed: All tests pass.")[0]
    fw = {"type": "function_call", "call_id": "call_wait", "name": "wait_agent", "arguments": '{"targets": ["a1"]}'}
    t6 = _turn(sid, 6, R, p2, "Done.", more(after, fw, out("call_wait", "completed: All tests pass.")))
    turns = [t0, t1, t2, t3, t4, t5, t6]
    _record(store, sid, "codex", turns)
    return turns


def claude_session(store: RunStore, sid: str = "claude-subagent") -> list[Turn]:
    """No harness marker: the parent (0), an `Agent` sub-agent (1, 2), the parent again (3),
    then the parent's own compaction (4: a new segment that follows, not a sub-agent)."""
    A = Dialect.ANTHROPIC
    system = "You are Claude Code."
    user = {"role": "user", "content": [{"type": "text", "text": "Fix the calculator."}]}
    agent_call = _call("toolu_1", "Agent", {"prompt": "fix calc.py"})

    def body(*messages: dict[str, Any]) -> dict[str, Any]:
        return {"model": "policy", "system": system, "messages": list(messages), "max_tokens": 512}

    p0, _ = encode("Fix the calculator.")
    t0 = _turn(sid, 0, A, p0, "Delegating.", body(user), tool_calls=[agent_call])
    s0, _ = encode("fix calc.py")
    sub_user = {"role": "user", "content": "fix calc.py"}
    handed = [  # history the sub-agent starts from (copied context, not sampled in this session)
        {"role": "user", "content": "Context:"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Read it first."},
                {"type": "tool_use", "id": "toolu_0", "name": "Read", "input": {"path": "calc.py"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "def add"}]},
    ]
    t1 = _turn(sid, 1, A, s0, "Editing.", body(*handed, sub_user), format_error=True)
    s1 = s0 + t1.completion_ids + encode("ok")[0]
    t2 = _turn(
        sid,
        2,
        A,
        s1,
        "Edited.",
        body(*handed, sub_user, {"role": "assistant", "content": "Editing."}, {"role": "user", "content": "ok"}),
    )
    p1 = p0 + t0.completion_ids + encode("Edited.")[0]
    echo = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Agent", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Edited."}]}
    t3 = _turn(sid, 3, A, p1, "Checking.", body(user, echo, result))
    c0, _ = encode("Earlier: the calculator was fixed by a sub-agent.")
    t4 = _turn(sid, 4, A, c0, "All good.", body({"role": "user", "content": "Earlier: fixed."}))
    turns = [t0, t1, t2, t3, t4]
    _record(store, sid, "claude-code", turns)
    return turns


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("atif") / "run"
    with RunStore(run) as store:
        write_demo_run(store, steps=2, tasks=2, group_size=4, seed=3)
        codex_session(store)
        claude_session(store)
        store.start_session("no-turns", step=1, instance_id="calc-0002", harness="command")  # sandbox never started
        store.set_outcome("no-turns", Outcome(reward=0.0, status=Status.SANDBOX_START_FAILED, masked=True))
    return run


@pytest.fixture(scope="module")
def exported(run_dir: Path) -> Path:
    out = run_dir.parent / "atif-out"
    proc = export(run_dir, out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["files"] == 19
    return out


def _doc(exported: Path, sid: str) -> dict[str, Any]:
    return json.loads((exported / f"{sid}.json").read_text())


def _agent_steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    steps = [s for s in doc["steps"] if s["source"] == "agent" and "metrics" in s]
    for sub in doc.get("subagent_trajectories", []):
        steps += _agent_steps(sub)
    return steps


# ----------------------------------------------------------------- tests
def test_harbor_validator_accepts_every_exported_file(exported: Path, tmp_path: Path) -> None:
    errors = harbor_errors(exported)
    assert len(errors) == 19 and all(
        json.loads(p.read_text())["schema_version"] == SCHEMA_VERSION for p in exported.glob("*.json")
    )
    assert {k: v for k, v in errors.items() if v} == {}
    # the validator does reject what is not ATIF: the check above can fail
    doc = _doc(exported, "codex-subagents")
    doc["subagent_trajectories"][0]["steps"][0]["step_id"] = 7
    doc["steps"][-1]["metrics"]["token_ids"] = [1]
    (tmp_path / "broken.json").write_text(json.dumps(doc))
    (bad,) = harbor_errors(tmp_path).values()
    assert any("step_id" in e for e in bad) and any("token_ids" in e for e in bad), bad


def test_token_ids_and_logprobs_are_the_stores_exactly(run_dir: Path, exported: Path) -> None:
    with RunStore(run_dir, readonly=True) as store:
        sids = list(store.iter_session_ids())
        assert len(sids) == 19
        n_turns = 0
        for sid in sids:
            turns = {t.index: t for t in store.load_turns(sid)}
            steps = _agent_steps(_doc(exported, sid))
            assert sorted(s["extra"]["legorl"]["turn_index"] for s in steps) == sorted(turns), sid  # each call once
            for s in steps:
                t, m = turns[s["extra"]["legorl"]["turn_index"]], s["metrics"]
                assert m["prompt_token_ids"] == t.prompt_ids and m["completion_token_ids"] == t.completion_ids
                assert m["logprobs"] == t.logprobs  # bit-exact floats (the store keeps float32)
                assert (m["prompt_tokens"], m["completion_tokens"]) == (len(t.prompt_ids), len(t.completion_ids))
                assert s["extra"]["legorl"]["side_call"] == t.side_call
            n_turns += len(turns)
        assert n_turns > 40
    # and they are the logprobs the engine gave, as float32
    codex = {s["extra"]["legorl"]["turn_index"]: s for s in _agent_steps(_doc(exported, "codex-subagents"))}
    with RunStore(run_dir.parent / "again") as scratch:
        for t in codex_session(scratch):
            assert codex[t.index]["metrics"]["logprobs"] == np.float32(t.logprobs).astype(float).tolist()


def test_sub_agents_are_embedded_and_side_calls_marked(exported: Path) -> None:
    doc = _doc(exported, "codex-subagents")
    legorl = doc["extra"]["legorl"]
    assert legorl["outcome"]["status"] == "resolved" and legorl["advantage"] == 0.5 and legorl["side_turns"] == [4]
    assert [s["turn_indices"] for s in legorl["segments"]] == [[0, 3, 6], [1, 2], [5]]
    root = [
        (s["extra"]["legorl"]["turn_index"], s["extra"]["legorl"]["side_call"])
        for s in _agent_steps({"steps": doc["steps"]})
    ]
    assert root == [(0, False), (3, False), (4, True), (6, False)]  # the compaction side call, marked, in place
    subs = doc["subagent_trajectories"]
    assert [sub["trajectory_id"] for sub in subs] == ["codex-subagents#segment-1", "codex-subagents#segment-2"]
    assert [[s["extra"]["legorl"]["turn_index"] for s in _agent_steps(sub)] for sub in subs] == [[1, 2], [5]]
    assert all(sub["session_id"] == "codex-subagents" and sub["steps"][0]["step_id"] == 1 for sub in subs)
    # the parent's step current when each sub-agent started refers to it
    refs = [
        (s["extra"]["legorl"]["turn_index"], ref["trajectory_id"])
        for s in doc["steps"]
        for r in s.get("observation", {}).get("results", [])
        for ref in r.get("subagent_trajectory_ref", [])
    ]
    assert refs == [(0, "codex-subagents#segment-1"), (3, "codex-subagents#segment-2")]
    # tool outputs are observations of the call they answer
    (ls,) = [s for s in subs[0]["steps"] if s.get("tool_calls")]
    assert ls["observation"]["results"] == [{"source_call_id": "call_ls", "content": "calc.py test_calc.py"}]
    assert doc["agent"] == {**doc["agent"], "name": "codex", "version": "0.169.0", "model_name": "legorl-policy"}
    tools = {d["function"]["name"] for d in doc["agent"]["tool_definitions"]}
    assert {"exec_command", "spawn_agent", "wait_agent"} <= tools  # the namespace's functions, flattened
    sub_tools = {d["function"]["name"] for d in subs[0]["agent"]["tool_definitions"]}
    assert "exec_command" in sub_tools and "spawn_agent" not in sub_tools  # what the sub-agent was offered


def test_an_unmarked_sub_agent_is_found_by_interleaving_and_a_compaction_stays_in_the_root(exported: Path) -> None:
    doc = _doc(exported, "claude-subagent")
    root = [
        (s["extra"]["legorl"]["turn_index"], s["extra"]["legorl"]["segment"])
        for s in _agent_steps({"steps": doc["steps"]})
    ]
    assert root == [(0, 0), (3, 0), (4, 2)]
    (sub,) = doc["subagent_trajectories"]
    assert [s["extra"]["legorl"]["turn_index"] for s in _agent_steps(sub)] == [1, 2]
    assert sub["steps"][:2] == [
        {"step_id": 1, "source": "system", "message": "You are Claude Code."},
        {"step_id": 2, "source": "user", "message": "Context:"},
    ]
    call = {"tool_call_id": "toolu_0", "function_name": "Read", "arguments": {"path": "calc.py"}}
    assert sub["steps"][2] == {
        "step_id": 3,
        "source": "agent",
        "message": "",
        "is_copied_context": True,  # handed over, not sampled: no metrics, not to be trained on
        "reasoning_content": "Read it first.",
        "tool_calls": [call],
        "observation": {"results": [{"source_call_id": "toolu_0", "content": "def add"}]},
    }
    assert [s["source"] for s in sub["steps"][3:]] == ["user", "agent", "user", "agent"]
    assert _agent_steps(sub)[0]["extra"]["legorl"]["format_error"] is True  # kept through the store
    (result,) = [r for s in doc["steps"] for r in s.get("observation", {}).get("results", []) if "content" in r]
    assert result == {"source_call_id": "toolu_1", "content": "Edited."}


def test_a_session_without_turns_is_one_valid_file(exported: Path) -> None:
    doc = _doc(exported, "no-turns")
    assert [s["source"] for s in doc["steps"]] == ["system"]
    assert doc["extra"]["legorl"]["outcome"]["status"] == "sandbox_start_failed"


def test_read_back_assembles_the_stores_segments(run_dir: Path, exported: Path) -> None:
    with RunStore(run_dir, readonly=True) as store:
        for sid in ["codex-subagents", "claude-subagent", "s001-01-02-3"]:
            turns = read_turns(exported / f"{sid}.json")
            want = store.load_trajectory(sid)
            assert want is not None
            got = assemble(turns, sid)
            assert [
                (s.turn_indices, s.token_ids, s.loss_mask, np.float32(s.logprobs).tolist()) for s in got.segments
            ] == [(s.turn_indices, s.token_ids, s.loss_mask, s.logprobs) for s in want.segments], sid
            assert got.side_turns == want.side_turns


@pytest.mark.parametrize(
    "case, expect",
    [
        ("not-a-run", "is not a run directory"),
        ("unknown-format", "unknown --format 'csv'"),
        ("out-under-a-file", "cannot write --out"),
        ("not-a-database", "cannot read the run store"),
    ],
)
def test_bad_input_is_one_line(run_dir: Path, tmp_path: Path, case: str, expect: str) -> None:
    run, fmt, out = run_dir, "atif", tmp_path / "out"
    if case == "not-a-run":
        run = tmp_path
    elif case == "unknown-format":
        fmt = "csv"
    elif case == "out-under-a-file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "atif"  # not writable, even for root
    else:
        run = tmp_path / "fake"
        run.mkdir()
        (run / "run.sqlite").write_text("not sqlite")
    proc = export(run, out, fmt)
    assert proc.returncode != 0 and expect in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_jsonl_and_parquet_through_the_same_command(run_dir: Path, tmp_path: Path) -> None:
    proc = export(run_dir, tmp_path / "run.jsonl", "jsonl")
    assert proc.returncode == 0 and json.loads(proc.stdout)["trajectories"] == 19, proc.stderr
    assert len((tmp_path / "run.jsonl").read_text().splitlines()) == 19
    proc = export(run_dir, tmp_path / "pq", "parquet")
    assert proc.returncode == 0 and json.loads(proc.stdout)["trajectories"] == 19, proc.stderr
    proc = export(run_dir, tmp_path, "jsonl")
    assert proc.returncode != 0 and "is a directory" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


QUICKSTART_SLICE = {  # examples/quickstart.toml, one small step: (section, key) -> value
    ("run", "steps"): "1",
    ("run", "tasks_per_step"): "2",
    ("run", "group_size"): "4",
    ("heldout", "tasks"): "0",
    ("warm_start", "episodes"): "8",
    ("warm_start", "steps"): "2",
    ("warm_start", "control_steps"): "0",
}


@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_file_of_a_quickstart_run_validates(tmp_path: Path) -> None:
    """`legorl train` on a slice of the quickstart (the warm mini-swe-agent, the hf engine,
    local sandboxes), then `legorl export --format atif`: Harbor accepts every file, and
    every recorded turn is one agent step with its ids and logprobs."""
    lines, section = [], ""
    for line in (ROOT / "examples" / "quickstart.toml").read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        key = line.split("=", 1)[0].strip()
        if (section, key) in QUICKSTART_SLICE:
            line = f"{key} = {QUICKSTART_SLICE[section, key]}"
        elif (section, key) == ("run", "dir"):
            line = f'dir = "{tmp_path / "run"}"'
        lines.append(line)
    config = tmp_path / "quickstart-slice.toml"
    config.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        [*LEGORL, "train", str(config)], capture_output=True, text=True, timeout=1100, check=False, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    docs = exported_and_valid(tmp_path / "run", tmp_path / "atif")
    with RunStore(tmp_path / "run", readonly=True) as store:
        n_turns = sum(len(store.load_turns(sid)) for sid in store.iter_session_ids())
        assert len(docs) == len(list(store.iter_session_ids())) >= 8 + 8  # warm start + one step
    steps = [s for d in docs for s in _agent_steps(d)]
    assert len(steps) == n_turns > 0
    assert all(len(s["metrics"]["logprobs"]) == len(s["metrics"]["completion_token_ids"]) for s in steps)


def test_another_producers_file_reads_in_file_order(tmp_path: Path) -> None:
    """A file without our `extra` (another producer's): steps with ids are policy calls in
    file order, sub-agents' after the root's; steps without ids are skipped; ids without a
    logprob per token are refused, never filled in."""

    def step(i: int, prompt: list[int], completion: list[int], logprobs: list[float] | None) -> dict[str, Any]:
        m: dict[str, Any] = {"prompt_token_ids": prompt, "completion_token_ids": completion}
        if logprobs is not None:
            m["logprobs"] = logprobs
        return {"step_id": i, "source": "agent", "message": "", "metrics": m}

    doc = {
        "schema_version": SCHEMA_VERSION,
        "session_id": "foreign",
        "agent": {"name": "terminus-2", "version": "2"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "hi"},
            step(2, [1, 2], [3], [-0.5]),
            {"step_id": 3, "source": "agent", "message": "no ids", "metrics": {"prompt_tokens": 4}},
            step(4, [1, 2, 3, 9], [4, 5], [-0.25, -1.0]),
        ],
        "subagent_trajectories": [
            {"trajectory_id": "sub", "agent": {"name": "s", "version": "1"}, "steps": [step(1, [7], [8], [-2.0])]}
        ],
    }
    (tmp_path / "foreign.json").write_text(json.dumps(doc))
    assert harbor_errors(tmp_path) == {"foreign.json": []}  # valid ATIF
    turns = read_turns(tmp_path / "foreign.json")
    assert [(t.index, t.prompt_ids, t.completion_ids, t.logprobs) for t in turns] == [
        (0, [1, 2], [3], [-0.5]),
        (1, [1, 2, 3, 9], [4, 5], [-0.25, -1.0]),
        (2, [7], [8], [-2.0]),
    ]
    traj = assemble(turns, "foreign")
    assert [s.turn_indices for s in traj.segments] == [[0, 1], [2]]
    doc["steps"][3]["metrics"].pop("logprobs")
    with pytest.raises(ValueError, match="step 4: no logprobs for 2 completion tokens"):
        read_turns(doc)
