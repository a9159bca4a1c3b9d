"""The oracle policy/engine: each harness's tool set, compaction, titles, real tokens."""

from __future__ import annotations

import json
import re

import pytest

from legorl.engine.base import ContextLengthExceeded
from legorl.engine.oracle import (
    MARK,
    PATCH_EOF,
    OracleEngine,
    OraclePolicy,
    OracleTask,
    find_shell,
    parse_prompt,
    patched_files,
)
from legorl.engine.registry import EngineConfig, make_engine
from legorl.models import load_tokenizer
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.renderer import ChatRequest
from legorl.proxy.toolcalls import parse_completion
from legorl.types import FinishReason, SamplingParams

PATCH = (
    "diff --git a/calc/core.py b/calc/core.py\n--- a/calc/core.py\n+++ b/calc/core.py\n"
    "@@ -1,3 +1,3 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
)
TASK = OracleTask(
    "calc__add-1",
    "add() subtracts instead of adding: add(2, 3) returns -1, expected 5.",
    PATCH,
    "pytest tests/test_core.py",
)
OTHER = OracleTask("calc__mul-2", "mul() returns the sum of its arguments instead of the product.", PATCH)


def _fn(name: str, props: dict, required: list[str]) -> dict:
    params = {"type": "object", "properties": props, "required": required}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": params}}


STR = {"type": "string"}
# The tool sets (names, required parameters) the four harnesses send.
CLAUDE = (
    "You are a Claude agent.",
    [
        _fn("Bash", {"command": STR, "timeout": {"type": "number"}}, ["command"]),
        _fn("Read", {"file_path": STR}, ["file_path"]),
    ],
)
OPENCODE = (
    "You are opencode.",
    [
        _fn("bash", {"command": STR, "description": STR}, ["command", "description"]),
        _fn("edit", {"filePath": STR}, ["filePath"]),
    ],
)
OPENHANDS = (
    "You are OpenHands agent.",
    [
        _fn(
            "terminal",
            {
                "command": STR,
                "security_risk": {"type": "string", "enum": ["LOW", "MEDIUM", "HIGH"]},
                "is_input": {"type": "boolean"},
            },
            ["command", "security_risk"],
        ),
        _fn("file_editor", {"command": STR, "path": STR}, ["command", "path"]),
        _fn("finish", {"message": STR}, ["message"]),
    ],
)
MINI = (
    "You are a helpful assistant. Finish with `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.",
    [_fn("bash", {"command": STR}, ["command"])],
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-qwen3")


@pytest.fixture(scope="module")
def renderer(tok):
    return ChatMLRenderer(tok)


def _assistant(text: str) -> dict:
    p = parse_completion(text)
    m: dict = {"role": "assistant", "content": p.content}
    if p.reasoning:
        m["reasoning_content"] = p.reasoning
    if p.tool_calls:
        m["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in p.tool_calls
        ]
    return m


def _episode(renderer, policy, system, tools, problem, max_turns=8):
    """Drive the policy as a harness would; returns the assistant messages."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": problem}]
    out = []
    for _ in range(max_turns):
        text = renderer.decode(renderer.render(ChatRequest(msgs, tools)))
        m = _assistant(policy.complete(text))
        msgs.append(m)
        out.append(m)
        if not m.get("tool_calls"):
            break
        call = m["tool_calls"][0]
        if call["function"]["name"] == "finish" or "COMPLETE_TASK" in call["function"]["arguments"]:
            break
        msgs.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
    return out


@pytest.mark.parametrize("harness", ["claude", "opencode", "openhands", "mini"])
def test_plan_through_each_tool_set(renderer, harness) -> None:
    system, tools = {"claude": CLAUDE, "opencode": OPENCODE, "openhands": OPENHANDS, "mini": MINI}[harness]
    policy = OraclePolicy({TASK.instance_id: TASK, OTHER.instance_id: OTHER})
    turns = _episode(renderer, policy, system, tools, "Please fix this.\n" + TASK.problem_statement)
    assert len(turns) == 4
    calls = [json.loads(t["tool_calls"][0]["function"]["arguments"]) for t in turns[:3]]
    for k, args in enumerate(calls, start=1):
        assert f"{MARK}:step-{k} {MARK}:task={TASK.instance_id}" in args["command"]
    assert "head -c" in calls[0]["command"] and "calc/core.py" in calls[0]["command"]
    body = re.search(rf"<<'{PATCH_EOF}'\n(.*)\n{PATCH_EOF}\n", calls[1]["command"], re.S)
    assert body is not None and body.group(1) + "\n" == PATCH  # the gold patch, byte for byte
    assert "git apply" in calls[1]["command"] and TASK.test_cmd in calls[2]["command"]
    last = turns[3]
    if harness == "openhands":  # finish tool; required enum parameters filled
        assert last["tool_calls"][0]["function"]["name"] == "finish"
        assert calls[0]["security_risk"] == "LOW"
    elif harness == "mini":
        assert json.loads(last["tool_calls"][0]["function"]["arguments"]) == {
            "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
        }
    else:  # Claude Code and OpenCode end with a plain answer
        assert not last.get("tool_calls") and f"{MARK}:step-4" in last["content"]
    if harness == "opencode":
        assert calls[0]["description"]  # required string parameter filled
    assert all(t.get("reasoning_content") for t in turns)


def test_delegate_hands_the_task_to_a_sub_agent_tool(renderer) -> None:
    system, tools = CLAUDE
    agent = _fn(
        "Agent",
        {"description": STR, "prompt": STR, "subagent_type": STR, "run_in_background": {"type": "boolean"}},
        ["description", "prompt"],
    )
    policy = OraclePolicy({TASK.instance_id: TASK}, delegate=True)
    first = _episode(renderer, policy, system, [*tools, agent], TASK.problem_statement, max_turns=1)[0]
    call = first["tool_calls"][0]["function"]
    args = json.loads(call["arguments"])
    assert call["name"] == "Agent" and args["run_in_background"] is False
    assert TASK.problem_statement in args["prompt"] and f"{MARK}:task={TASK.instance_id}" in args["prompt"]
    # the sub-agent gets the same tool (a fork would): the delegation marker stops a second hand-off
    sub = _episode(renderer, policy, system, [*tools, agent], args["prompt"])
    assert len(sub) == 4 and all(t["tool_calls"][0]["function"]["name"] == "Bash" for t in sub[:3])
    # without the option the tool is ignored
    plain = OraclePolicy({TASK.instance_id: TASK})
    assert (
        _episode(renderer, plain, system, [*tools, agent], TASK.problem_statement, max_turns=1)[0]["tool_calls"][0][
            "function"
        ]["name"]
        == "Bash"
    )


def test_summary_title_and_prefill(renderer) -> None:
    policy = OraclePolicy({TASK.instance_id: TASK})
    done = _episode(renderer, policy, *OPENCODE, TASK.problem_statement, max_turns=2)
    convo = [
        {"role": "system", "content": "You are a context summarization agent."},
        {"role": "user", "content": "Here is the conversation so far: " + json.dumps(done)},
    ]
    summary = policy.complete(renderer.decode(renderer.render(ChatRequest(convo, []))))
    assert "<summary>" in summary and f"{MARK}:step-2" in summary and f"{MARK}:task={TASK.instance_id}" in summary
    assert "<tool_call>" not in summary
    # Claude Code's compaction keeps the tools but appends "Do NOT call any tools".
    cc = [
        {"role": "system", "content": CLAUDE[0]},
        {"role": "user", "content": TASK.problem_statement},
        done[0],
        {"role": "tool", "tool_call_id": "x", "content": "ok"},
        {"role": "user", "content": "Summarise. REMINDER: Do NOT call any tools. Respond with plain text only."},
    ]
    assert "<tool_call>" not in policy.complete(renderer.decode(renderer.render(ChatRequest(cc, CLAUDE[1]))))
    title = [
        {"role": "system", "content": "You are a title generator."},
        {"role": "user", "content": TASK.problem_statement},
    ]
    assert policy.complete(renderer.decode(renderer.render(ChatRequest(title, [])))).startswith("Fix: add()")
    # OpenCode's max-steps prefill: a trailing open assistant message gets text only.
    pre = [
        {"role": "system", "content": OPENCODE[0]},
        {"role": "user", "content": TASK.problem_statement},
        {"role": "assistant", "content": "CRITICAL - MAXIMUM STEPS REACHED. Respond with text only."},
    ]
    text = renderer.decode(renderer.render(ChatRequest(pre, OPENCODE[1], add_generation_prompt=False)))
    assert parse_prompt(text).open_assistant is not None
    assert "<tool_call>" not in policy.complete(text)


def test_after_compaction_the_markers_carry_on(renderer) -> None:
    """A compacted history keeps only the summary: task and progress come from markers."""
    policy = OraclePolicy({TASK.instance_id: TASK, OTHER.instance_id: OTHER})
    summary = f"Summary: fixed nothing yet. {MARK}:step-1 {MARK}:step-2 {MARK}:task={OTHER.instance_id}"
    msgs = [{"role": "system", "content": CLAUDE[0]}, {"role": "user", "content": summary}]
    nxt = _assistant(policy.complete(renderer.decode(renderer.render(ChatRequest(msgs, CLAUDE[1])))))
    args = json.loads(nxt["tool_calls"][0]["function"]["arguments"])
    assert f"{MARK}:step-3 {MARK}:task={OTHER.instance_id}" in args["command"]


def test_unknown_task_and_no_shell(renderer) -> None:
    policy = OraclePolicy({TASK.instance_id: TASK, OTHER.instance_id: OTHER})
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "something else entirely"}]
    out = policy.complete(renderer.decode(renderer.render(ChatRequest(msgs, CLAUDE[1]))))
    assert "could not identify the task" in out and "<tool_call>" not in out
    edit_only = [_fn("edit", {"path": STR}, ["path"])]
    assert find_shell([t["function"] for t in edit_only]) is None
    msgs[1]["content"] = TASK.problem_statement
    assert "no shell tool" in policy.complete(renderer.decode(renderer.render(ChatRequest(msgs, edit_only))))


def test_patched_files() -> None:
    new = "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n"
    patch = PATCH + new
    assert patched_files(patch) == ["calc/core.py", "new.py"]


async def test_engine_emits_real_tokens(tok, renderer) -> None:
    eng = OracleEngine(tok, [TASK], logprob=-0.25)
    msgs = [{"role": "system", "content": MINI[0]}, {"role": "user", "content": TASK.problem_statement}]
    prompt = renderer.render(ChatRequest(msgs, MINI[1]))
    gen = await eng.generate(prompt, SamplingParams(max_tokens=4096))
    assert gen.finish_reason is FinishReason.STOP and gen.completion_ids[-1] == renderer.im_end
    text = tok.decode(gen.completion_ids[:-1], skip_special_tokens=False)
    assert tok.encode(text, add_special_tokens=False) == gen.completion_ids[:-1]  # the tokenizer's own ids
    assert parse_completion(text).tool_calls and set(gen.logprobs) == {-0.25}
    cut = await eng.generate(prompt, SamplingParams(max_tokens=7))
    assert len(cut.completion_ids) == 7 and cut.finish_reason is FinishReason.LENGTH
    stop = await eng.generate(prompt, SamplingParams(max_tokens=4096, stop=("</think>",)))
    assert tok.decode(stop.completion_ids).rstrip().endswith("</think>") and stop.finish_reason is FinishReason.STOP
    small = OracleEngine(tok, [TASK], max_context=len(prompt))
    with pytest.raises(ContextLengthExceeded):
        await small.generate(prompt, SamplingParams())


def test_engine_from_registry(tmp_path) -> None:
    with pytest.raises(ValueError, match="options.tasks is required"):
        make_engine(EngineConfig(kind="oracle"))
    with pytest.raises(ValueError, match="options.bogus: unknown option for engine kind 'oracle'"):
        make_engine(EngineConfig(kind="oracle", options={"tasks": "tasks.jsonl", "bogus": 1}))
    f = tmp_path / "tasks.jsonl"
    row = {
        "instance_id": "x__1",
        "repo": "x/x",
        "base_commit": "a" * 40,
        "problem_statement": "p",
        "patch": PATCH,
        "test_patch": PATCH,
        "FAIL_TO_PASS": ["tests/test_core.py::test_add"],
        "PASS_TO_PASS": [],
        "repo_path": "repo.bundle",
    }
    f.write_text(json.dumps(row) + "\n")
    eng = make_engine(EngineConfig(kind="oracle", options={"tasks": str(f), "think": False}))
    assert eng.name == "oracle" and list(eng.policy.tasks) == ["x__1"] and not eng.policy.think


async def test_oracle_through_the_proxy_with_official_clients(tok) -> None:
    """Streamed OpenAI tool-call deltas and Anthropic thinking/tool_use blocks, end to end."""
    import anthropic
    import openai

    from legorl.proxy.config import ProxyConfig
    from legorl.proxy.server import ProxyServer

    eng = OracleEngine(tok, [TASK])
    async with ProxyServer(ProxyConfig(port=0), eng, ChatMLRenderer(tok)) as srv:
        srv.open_session("oa")
        srv.open_session("an")
        client = openai.AsyncOpenAI(base_url=srv.session_url("oa") + "/v1", api_key="x")
        stream = await client.chat.completions.create(
            model="legorl-policy",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "system", "content": OPENCODE[0]}, {"role": "user", "content": TASK.problem_statement}],
            tools=OPENCODE[1],
            tool_choice="auto",
        )
        args, usage = "", None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                for d in c.delta.tool_calls or []:
                    args += d.function.arguments or ""
        assert f"{MARK}:step-1" in json.loads(args)["command"] and usage.completion_tokens > 0
        ac = anthropic.AsyncAnthropic(base_url=srv.session_url("an"), api_key="x")
        tools = [{"name": "Bash", "description": "run", "input_schema": CLAUDE[1][0]["function"]["parameters"]}]
        async with ac.messages.stream(
            model="legorl-policy",
            max_tokens=4096,
            system=CLAUDE[0],
            tools=tools,
            messages=[{"role": "user", "content": TASK.problem_statement}],
        ) as s:
            msg = await s.get_final_message()
        kinds = [b.type for b in msg.content]
        assert kinds[0] == "thinking" and kinds[-1] == "tool_use" and msg.stop_reason == "tool_use"
        assert f"{MARK}:step-1" in msg.content[-1].input["command"]
        turns = srv.close_session("oa") + srv.close_session("an")
    assert all(len(t.logprobs) == len(t.completion_ids) > 0 for t in turns)


def test_tasks_sharing_a_long_prefix_are_told_apart(renderer) -> None:
    head = "There seems to be a regression. " * 12  # > 300 characters shared
    a = OracleTask("p__a", head + "pluralize() is wrong.", PATCH)
    b = OracleTask("p__b", head + "singularize() is wrong.", PATCH)
    policy = OraclePolicy({a.instance_id: a, b.instance_id: b})
    for t in (a, b):
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "Task:\n" + t.problem_statement}]
        view = parse_prompt(renderer.decode(renderer.render(ChatRequest(msgs, MINI[1]))))
        assert policy.identify(view) is t
