"""The hf engine's prefix reuse: a request that starts with a finished request's tokens
copies their KV columns instead of computing them, and samples what a full prefill would."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from legorl.engine.hf import HFEngine
from legorl.engine.kv_prefix import Prefix, PrefixStore, common_prefix
from legorl.model_families import save
from legorl.models import load_tokenizer
from legorl.types import SamplingParams

TOK = load_tokenizer("tiny-qwen3")
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def entry(ids: list[int]) -> Prefix:
    kv = [torch.zeros(1, len(ids), 2)]
    return Prefix(tuple(ids), kv, kv)


def test_the_store_keeps_the_longest_match_drops_what_a_newer_entry_extends_and_evicts_the_oldest() -> None:
    store = PrefixStore(max_tokens=100, min_reuse=4)
    a = list(range(10, 40))  # 30 ids
    store.put(entry(a))
    assert store.match(a + [1, 2]) is not None and store.match(a + [1, 2])[1] == 30
    assert store.match(a)[1] == 29  # never the whole prompt: its last token gives the logits
    assert store.match([10, 11, 12, 99]) is None  # 3 shared ids < min_reuse
    store.put(entry(a + [7] * 20))  # extends a: a is dropped
    assert len(store) == 1 and store.tokens == 50
    store.put(entry(list(range(200, 240))))
    store.put(entry(list(range(300, 340))))  # 50 + 40 + 40 > 100: the least recently used goes
    assert store.tokens == 80 and store.match(a + [1]) is None
    store.clear()
    assert len(store) == 0 and store.tokens == 0
    assert common_prefix(tuple(range(200)), list(range(130)) + [0]) == 130
    assert common_prefix((), [1, 2]) == 0 and common_prefix((5,), [6]) == 0
    assert common_prefix(np.arange(50), list(range(40))) == 40  # one a prefix of the other


def chat(turns: list[str]) -> list[int]:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return TOK.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"]


async def two_turns(engine: HFEngine) -> list[tuple[list[int], list[float]]]:
    """Turn 1, then (together) its next turn, which extends it, and an unrelated prompt."""
    first = chat(["fix the failing test in utils.py; the parser drops the last field of every row"])
    g1 = await engine.generate(first, GREEDY)
    follow = first + g1.completion_ids + chat(["ok"])[1:] + [5, 6, 7, 8]
    other = chat(["what does git bisect do, and when should I use it?"])
    g2, g3 = await asyncio.gather(engine.generate(follow, GREEDY), engine.generate(other, GREEDY))
    return [(g.completion_ids, g.logprobs) for g in (g1, g2, g3)]


@pytest.mark.parametrize("model", ["tiny-qwen3", "gpt_oss"])
async def test_a_next_turn_reuses_the_last_turns_columns_and_samples_what_a_full_prefill_does(
    model: str, tmp_path
) -> None:
    torch.manual_seed(0)
    # gpt_oss: a sliding window of 8 beside full attention (its routing is not recorded here:
    # an engine recording routing does not reuse)
    path = model if model.startswith("tiny-") else str(save(model, tmp_path / model))
    opts = {"seed": 0, "record_routing": False}
    reusing, fresh = HFEngine(path, TOK, **opts), HFEngine(path, TOK, **opts, prefix_cache_tokens=0)
    try:
        got, want = await two_turns(reusing), await two_turns(fresh)
        assert reusing.stats["reused_tokens"] >= 20 and fresh.stats["reused_tokens"] == 0
        for (ids, lps), (want_ids, want_lps) in zip(got, want, strict=True):
            assert ids == want_ids
            assert lps == pytest.approx(want_lps, abs=1e-4)
    finally:
        await asyncio.gather(reusing.close(), fresh.close())


SYSTEM = "You are a coding agent. Tools: bash(command) runs a command; edit(path, old, new) edits a file. " * 4


def session(task: str) -> list[int]:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    return TOK.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"]


async def first_turns(engine: HFEngine) -> list[tuple[list[int], list[float]]]:
    """Sessions of one harness starting at once (one system prompt, different tasks), and a
    group's two rollouts of one task (the same whole prompt)."""
    prompts = [session(t) for t in ("fix the parser", "fix the csv writer", "make the tests pass", "fix the parser")]
    gens = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    return [(g.completion_ids, g.logprobs) for g in gens]


async def test_sessions_starting_at_once_copy_one_prefill_of_their_shared_prompt() -> None:
    torch.manual_seed(0)
    reusing, fresh = HFEngine("tiny-qwen3", TOK, seed=0), HFEngine("tiny-qwen3", TOK, seed=0, prefix_cache_tokens=0)
    try:
        got, want = await first_turns(reusing), await first_turns(fresh)
        shared = common_prefix(tuple(session("fix the parser")), session("fix the csv writer"))
        assert shared > 100
        # the three that follow the first copy at least the shared system prompt (3 x shared - suffix slack)
        assert reusing.stats["reused_tokens"] >= 3 * (shared - 16) and fresh.stats["reused_tokens"] == 0
        assert reusing.stats["prompt_tokens"] == fresh.stats["prompt_tokens"]
        for (ids, lps), (want_ids, want_lps) in zip(got, want, strict=True):
            assert ids == want_ids
            assert lps == pytest.approx(want_lps, abs=1e-4)
    finally:
        await asyncio.gather(reusing.close(), fresh.close())


async def test_the_share_of_prompt_tokens_reused_is_what_the_engine_copied() -> None:
    """`legorl eval` reports the share (`prefill_share`); an engine that does not count has none."""
    from legorl.engine.base import prefill_share
    from legorl.engine.scripted import ScriptedEngine

    engine = HFEngine("tiny-qwen3", TOK, seed=0)
    try:
        assert prefill_share(engine) == {"prompt_tokens": 0, "reused_tokens": 0, "reused_share": 0.0}
        await first_turns(engine)
        share = prefill_share(engine)
        assert share is not None and share["reused_tokens"] == engine.stats["reused_tokens"] > 0
        assert share["reused_share"] == round(share["reused_tokens"] / share["prompt_tokens"], 4) < 1
    finally:
        await engine.close()
    assert prefill_share(ScriptedEngine(["x"], TOK)) is None and prefill_share(None) is None


async def test_new_weights_empty_the_store() -> None:
    engine = HFEngine("tiny-qwen3", seed=0)
    try:
        prompt = chat(["fix the failing test in utils.py; the parser drops the last field of every row"])
        g = await engine.generate(prompt, GREEDY)
        assert engine._prefixes is not None and len(engine._prefixes) == 1
        engine.load_state_dict({}, version=1)
        g2 = await engine.generate(prompt + g.completion_ids + [5, 6], GREEDY)
        assert engine.stats["reused_tokens"] == 0  # nothing the old weights computed is reused
        assert len(engine._prefixes) == 1  # only what the new weights computed: the last request
        await engine.generate(prompt + g.completion_ids + [5, 6] + g2.completion_ids + [7], GREEDY)
        assert engine.stats["reused_tokens"] > 0
    finally:
        await engine.close()


async def test_a_row_the_weights_changed_under_is_not_stored() -> None:
    """A request in flight across an update holds columns of both weights: not reusable."""
    engine = HFEngine("tiny-qwen3", seed=0)
    try:
        prompt = chat(["fix the failing test in utils.py; the parser drops the last field of every row"])
        long = SamplingParams(temperature=0.0, max_tokens=200, stop=[])
        stream = engine.stream(prompt, long)
        await anext(stream)
        engine.load_state_dict({}, version=1)
        async for _ in stream:
            pass
        await engine.generate(chat(["ok"]), GREEDY)  # the thread has dropped the finished row by now
        assert engine._prefixes is not None and all(len(e) < len(prompt) for e in engine._prefixes._entries)
    finally:
        await engine.close()


def test_linear_attention_and_routing_models_do_not_reuse(tmp_path) -> None:
    hybrid = HFEngine(str(save("qwen3_5", tmp_path / "qwen3_5")), TOK)
    moe = HFEngine("tiny-qwen3-moe")
    try:
        assert hybrid._prefixes is None and moe._prefixes is None
    finally:
        asyncio.run(hybrid.close())
        asyncio.run(moe.close())
