"""Sessions: addressing by URL prefix or key, side calls, recording to JSONL, the admin
route, concurrency, and the standalone `legorl proxy` process end to end."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import httpx
import openai
import orjson

from legorl.engine.scripted import ScriptedEngine
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.types import SamplingParams, TokenStep, Turn
from tests.helpers.paths import ROOT
from tests.helpers.proxy_util import SpyEngine, tokenizer

TOOL_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
REPO = ROOT


async def test_side_calls_are_answered_recorded_and_left_out(tmp_path: Path) -> None:
    engine = SpyEngine(ScriptedEngine([TOOL_CALL, "A short title", "Summary: did things"], tokenizer()))
    cfg = ProxyConfig(port=0, side_call_models=["small-fast-model"])
    async with ProxyServer(cfg, engine, ChatMLRenderer(tokenizer()), out_dir=tmp_path) as srv:
        srv.open_session("ep1", {"instance_id": "repo__1"})
        o = openai.AsyncOpenAI(base_url=srv.session_url("ep1") + "/v1", api_key="x", max_retries=0)
        main = [{"role": "system", "content": "You are opencode."}, {"role": "user", "content": "fix it"}]
        r = await o.chat.completions.create(model="policy", messages=main)
        assert r.choices[0].message.tool_calls
        title = await o.chat.completions.create(
            model="policy",
            messages=[
                {"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
                {"role": "user", "content": "fix it"},
            ],
        )
        assert title.choices[0].message.content == "A short title"
        a = anthropic.AsyncAnthropic(base_url=srv.session_url("ep1"), api_key="x", max_retries=0)
        compact = await a.messages.create(
            model="policy",
            max_tokens=100,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "fix it"},
                        {
                            "type": "text",
                            "text": (
                                "Your task is to create a detailed summary...\nREMINDER: Do NOT call any tools. "
                                "Respond with plain "
                                "text only — an <analysis> block followed by a <summary> block."
                            ),
                        },
                    ],
                }
            ],
        )
        assert compact.content[0].text.startswith("Summary")
        by_name = await o.chat.completions.create(model="small-fast-model", messages=main)
        assert by_name.choices[0].message.tool_calls
        turns = srv.close_session("ep1")
    assert [t.side_call for t in turns] == [False, True, True, True]
    lines = [orjson.loads(x) for x in (tmp_path / "turns.jsonl").read_bytes().splitlines()]
    assert [x["index"] for x in lines] == [0, 1, 2, 3] and {x["session"] for x in lines} == {"ep1"}
    assert Turn.from_dict({k: v for k, v in lines[0].items() if k != "session"}).prompt_ids == turns[0].prompt_ids
    trajs = [orjson.loads(x) for x in (tmp_path / "trajectories.jsonl").read_bytes().splitlines()]
    assert len(trajs) == 1 and trajs[0]["meta"] == {"instance_id": "repo__1"}
    t = trajs[0]["trajectory"]
    assert t["side_turns"] == [1, 2, 3] and len(t["segments"]) == 1 and t["segments"][0]["turn_indices"] == [0]


async def test_recorded_turn_fields_and_admin_routes(tmp_path: Path) -> None:
    engine = SpyEngine(ScriptedEngine(["<think>\nplan\n</think>\n\n" + TOOL_CALL], tokenizer()))
    cfg = ProxyConfig(port=0, temperature=0.7, top_p=0.9, max_tokens=500)
    async with ProxyServer(cfg, engine, ChatMLRenderer(tokenizer()), out_dir=tmp_path, standalone=True) as srv:
        engine.inner.policy_version = 7
        body = {
            "model": "harness-name",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0,
            "max_tokens": 300,
            "prompt_cache_key": "c",
        }
        async with httpx.AsyncClient(base_url=srv.base_url) as c:
            t0 = time.time()
            r = await c.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer run-a"})
            assert r.status_code == 200
            sessions = (await c.get("/legorl/sessions")).json()["sessions"]
            assert [(s["session"], s["turns"], s["managed"]) for s in sessions] == [("run-a", 1, False)]
            d = await c.delete("/legorl/sessions/run-a")
            assert d.status_code == 200 and d.json()["turns"] == 1
            assert (await c.delete("/legorl/sessions/run-a")).status_code == 404
            # standalone: the same key opens a fresh session
            assert (await c.post("/v1/chat/completions", json=body, headers={"x-api-key": "run-a"})).status_code == 200
    line = orjson.loads((tmp_path / "turns.jsonl").read_bytes().splitlines()[0])
    assert line["session"] == line["session_id"] == "run-a" and line["dialect"] == "openai_chat"
    assert line["sampling_used"]["temperature"] == 0.7 and line["sampling_used"]["max_tokens"] == 300
    assert line["sampling_requested"] == {"temperature": 0, "max_tokens": 300}
    assert line["request"] == body and line["model"] == "harness-name" and line["policy_version"] == 7
    assert line["tool_calls"][0]["name"] == "bash" and json.loads(line["tool_calls"][0]["arguments"]) == {
        "command": "ls"
    }
    assert line["response_text"].startswith("<think>") and line["finish_reason"] == "stop"
    assert t0 <= line["t_start"] <= line["t_first_token"] <= line["t_end"] <= time.time()
    call = engine.calls[0]
    assert line["prompt_ids"] == call.prompt_ids and line["logprobs"] == call.logprobs
    trajs = (tmp_path / "trajectories.jsonl").read_bytes().splitlines()
    assert len(trajs) == 2  # one closed by DELETE, one at shutdown


async def test_many_concurrent_streaming_sessions() -> None:
    engine = ScriptedEngine(["Sure, here is a longer answer with several tokens in it."], tokenizer())
    async with ProxyServer(ProxyConfig(port=0), engine, ChatMLRenderer(tokenizer()), standalone=True) as srv:
        limits = httpx.Limits(max_connections=1)
        tls = ssl.create_default_context()  # one for all clients: building one per client is slow

        async def session(i: int) -> bool:
            async with httpx.AsyncClient(base_url=srv.base_url, limits=limits, timeout=60, verify=tls) as c:
                ok = True
                for path, body in (
                    (
                        "/v1/messages",
                        {
                            "model": "m",
                            "max_tokens": 64,
                            "stream": True,
                            "messages": [{"role": "user", "content": f"hi {i}"}],
                        },
                    ),
                    (
                        "/v1/chat/completions",
                        {"model": "m", "stream": True, "messages": [{"role": "user", "content": f"hi {i}"}]},
                    ),
                ):
                    r = await c.post(path, json=body, headers={"x-api-key": f"s{i}"})
                    ok &= r.status_code == 200 and (
                        r.text.endswith("data: [DONE]\n\n") or "message_stop" in r.text[-60:]
                    )
                return ok

        results = await asyncio.gather(*[session(i) for i in range(128)])
        assert all(results)
        assert len(srv.sessions.open_sessions) == 128
        assert all(len(s.turns) == 2 for s in srv.sessions.open_sessions.values())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_standalone_process_records_and_shuts_down_cleanly(tmp_path: Path) -> None:
    cfg = tmp_path / "legorl.toml"
    cfg.write_text(
        '[proxy]\nmax_tokens = 64\n\n[engine]\nscripted_mode = "per_session"\n'
        f'scripted_completions = [{json.dumps(TOOL_CALL)}, "all done"]\n'
    )
    out, port = tmp_path / "out", _free_port()
    code = (
        "import sys; from pathlib import Path; from legorl.proxy.server import run_standalone; "
        f"run_standalone('scripted', 'tiny-qwen3', '127.0.0.1', {port}, Path({str(out)!r}), Path({str(cfg)!r}), "
        "token='tok')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        o = openai.OpenAI(base_url=base + "/s/alpha/v1", api_key="tok", max_retries=0)  # the session in the URL
        msgs = [{"role": "user", "content": "go"}]
        r = o.chat.completions.create(model="p", messages=msgs)
        call = r.choices[0].message.tool_calls[0]
        msgs += [
            {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "a.txt"},
        ]
        assert o.chat.completions.create(model="p", messages=msgs).choices[0].message.content == "all done"
        a = anthropic.Anthropic(base_url=base, api_key="tok:beta", max_retries=0)  # the session after the token
        assert (
            a.messages.create(model="p", max_tokens=100, messages=[{"role": "user", "content": "go"}]).content[0].type
            == "tool_use"
        )
        assert httpx.delete(base + "/legorl/sessions/alpha").status_code == 401  # management needs the token
        closed = httpx.delete(base + "/legorl/sessions/alpha", headers={"authorization": "Bearer tok"})
        assert closed.json()["turns"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    turns = [orjson.loads(x) for x in (out / "turns.jsonl").read_bytes().splitlines()]
    assert [(t["session"], t["dialect"]) for t in turns] == [
        ("alpha", "openai_chat"),
        ("alpha", "openai_chat"),
        ("beta", "anthropic"),
    ]
    for t in turns:
        assert len(t["logprobs"]) == len(t["completion_ids"]) > 0 and t["prompt_ids"] and not t["format_error"]
    trajs = [orjson.loads(x) for x in (out / "trajectories.jsonl").read_bytes().splitlines()]
    assert [t["session"] for t in trajs] == ["alpha", "beta"]
    alpha = trajs[0]["trajectory"]
    assert len(alpha["segments"]) == 1 and alpha["segments"][0]["turn_indices"] == [0, 1]


async def test_moe_routing_is_kept_once_per_position_and_reassembles_exactly(tmp_path: Path) -> None:
    """Engines report the whole prompt's routing on every call; the session keeps each
    position's rows once (turn.routing_base), and the assembled segments still carry the
    exact routing of every position — also across a compaction (a new segment)."""
    from legorl.engine.scripted import fake_routing
    from legorl.trajectory import assemble

    moe = (3, 2, 8)  # layers, top_k, experts
    engine = ScriptedEngine([TOOL_CALL, TOOL_CALL, "Done.", "Resumed.", "Finished."], tokenizer(), moe=moe)
    async with ProxyServer(ProxyConfig(port=0), engine, ChatMLRenderer(tokenizer()), out_dir=tmp_path) as srv:
        srv.open_session("ep")
        o = openai.AsyncOpenAI(base_url=srv.session_url("ep") + "/v1", api_key="x", max_retries=0)
        msgs: list[dict] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "fix it"}]
        for _ in range(3):
            r = await o.chat.completions.create(model="policy", messages=msgs)
            m = r.choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            for call in m.tool_calls or []:
                msgs.append({"role": "tool", "tool_call_id": call.id, "content": "a.py b.py"})
            if not m.tool_calls:
                msgs.append({"role": "user", "content": "and now?"})
        compacted = [msgs[0], {"role": "user", "content": "Summary of the work so far: listed files."}]
        r = await o.chat.completions.create(model="policy", messages=compacted)
        compacted += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
        await o.chat.completions.create(model="policy", messages=compacted)
        turns = srv.close_session("ep")
    assert len(turns) == 5
    bases = [t.routing_base for t in turns]
    assert bases[0] == 0 and bases[3] == 0  # first call, and the compacted prompt (no shared prefix)
    for i in (1, 2, 4):  # each extends the one before: only its new positions are kept
        prev = turns[i - 1]
        assert bases[i] == len(prev.prompt_ids) + len(prev.completion_ids) > 0
        assert len(turns[i].routed_experts) == len(turns[i].prompt_ids) + len(turns[i].completion_ids) - bases[i]
    traj = assemble(turns, "ep")
    assert [s.turn_indices for s in traj.segments] == [[0, 1, 2], [3, 4]]
    for seg in traj.segments:
        want = [fake_routing(t, p, *moe) for p, t in enumerate(seg.token_ids)]
        assert seg.routed_experts is not None and seg.routed_experts.tolist() == want
    kept = sum(len(t.routed_experts) for t in turns)
    assert kept == sum(len(s.token_ids) for s in traj.segments)  # linear in the episode, not turns x context
    # the recorded bodies are still what was sent, but each resent message is held once
    assert turns[4].request["messages"] == compacted
    assert turns[2].request["messages"][:3] == turns[1].request["messages"][:3]
    assert all(a is b for a, b in zip(turns[2].request["messages"], turns[1].request["messages"]))
    assert turns[4].request["messages"][1] is turns[3].request["messages"][1]
    # both records carry routing as numbers: the turns (trimmed, with their base) and the segments
    lines = [orjson.loads(x) for x in (tmp_path / "turns.jsonl").read_bytes().splitlines()]
    assert [x["routing_base"] for x in lines] == bases
    assert [x["routed_experts"] for x in lines] == [t.routed_experts.tolist() for t in turns]
    (rec,) = [orjson.loads(x) for x in (tmp_path / "trajectories.jsonl").read_bytes().splitlines()]
    assert [s["routed_experts"] for s in rec["trajectory"]["segments"]] == [
        s.routed_experts.tolist() for s in traj.segments
    ]


class _UpdatedMidTurn(SpyEngine):
    """The inner engine's weights change after the second token of every call: tokens say
    which version sampled them (as the hf engine's and vLLM's generate route's do)."""

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        n = 0
        async for step in super().stream(prompt_ids, params):
            if step.token_id is not None:
                n += 1
                if n == 3:
                    self.inner.policy_version = 4
                step = dataclasses.replace(step, policy_version=self.inner.policy_version)
            yield step


async def test_a_turn_across_a_weight_update_records_its_oldest_version(tmp_path: Path) -> None:
    engine = _UpdatedMidTurn(ScriptedEngine(["a long enough answer to span the update"], tokenizer()))
    engine.inner.policy_version = 3
    cfg = ProxyConfig(port=0, max_tokens=100)
    async with ProxyServer(cfg, engine, ChatMLRenderer(tokenizer()), out_dir=tmp_path, standalone=True) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url) as c:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            r = await c.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer run-v"})
            assert r.status_code == 200
    line = orjson.loads((tmp_path / "turns.jsonl").read_bytes().splitlines()[0])
    assert engine.policy_version == 4 and len(line["completion_ids"]) > 3
    assert line["policy_version"] == 3  # not the version at the turn's end
