"""The `scripted` engine: replay order, stops, fake logprobs/routing, and cost."""

from __future__ import annotations

import asyncio
import time

import pytest

from legorl.engine.base import ContextLengthExceeded, Engine
from legorl.engine.scripted import ScriptedEngine, fake_logprob
from legorl.models import load_tokenizer
from legorl.types import FinishReason, SamplingParams

TOK = load_tokenizer("tiny-qwen3")
SCRIPT = ["I will look at the file.", '<tool_call>\n{"name": "bash"}\n</tool_call>', "Done."]


def prompt(turns: int) -> list[int]:
    msgs = [{"role": "user", "content": "fix the bug"}]
    for i in range(turns):
        msgs += [{"role": "assistant", "content": SCRIPT[i % 3]}, {"role": "user", "content": f"result {i}"}]
    return TOK.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"]


def text(ids: list[int]) -> str:
    return TOK.decode(ids, skip_special_tokens=False)


async def test_cycle_replays_in_order_and_wraps() -> None:
    engine = ScriptedEngine(SCRIPT, TOK)
    assert isinstance(engine, Engine)
    got = [text((await engine.generate(prompt(0), SamplingParams())).completion_ids) for _ in range(4)]
    assert got == [s + "<|im_end|>" for s in SCRIPT + SCRIPT[:1]]


async def test_per_session_follows_the_turns_in_the_prompt() -> None:
    engine = ScriptedEngine(SCRIPT, TOK, mode="per_session")
    # two sessions interleaved: each gets the completion its history says it is at
    a0, b0, a1, b1, a2 = [await engine.generate(prompt(n), SamplingParams()) for n in (0, 0, 1, 1, 2)]
    assert text(a0.completion_ids) == text(b0.completion_ids) == SCRIPT[0] + "<|im_end|>"
    assert text(a1.completion_ids) == text(b1.completion_ids) == SCRIPT[1] + "<|im_end|>"
    assert text(a2.completion_ids) == SCRIPT[2] + "<|im_end|>"
    assert engine.turn_index(prompt(5)) == 5


async def test_completions_as_ids_are_replayed_verbatim() -> None:
    engine = ScriptedEngine([[5, 6, 7]], TOK)
    g = await engine.generate([1, 2], SamplingParams())
    assert g.completion_ids == [5, 6, 7] and g.finish_reason == FinishReason.STOP


async def test_stop_strings_and_max_tokens_truncate() -> None:
    engine = ScriptedEngine(SCRIPT[1:2], TOK)
    stopped = await engine.generate(prompt(0), SamplingParams(stop=("</tool_call>",)))
    assert stopped.finish_reason == FinishReason.STOP
    assert text(stopped.completion_ids).endswith("</tool_call>")
    assert "</tool_call>" not in text(stopped.completion_ids[:-1])
    short = await engine.generate(prompt(0), SamplingParams(max_tokens=3))
    assert short.finish_reason == FinishReason.LENGTH and len(short.completion_ids) == 3


async def test_logprobs_and_routing_are_fake_but_deterministic() -> None:
    engine = ScriptedEngine(SCRIPT[:1], TOK, moe=(4, 2, 8))
    p = prompt(0)
    a, b = await engine.generate(p, SamplingParams()), await engine.generate(p, SamplingParams())
    assert a.logprobs == b.logprobs and a.routed_experts.tolist() == b.routed_experts.tolist()
    assert a.logprobs[0] == fake_logprob(a.completion_ids[0], len(p))
    assert all(-3.0 <= lp < 0 for lp in a.logprobs)
    assert a.routed_experts is not None and len(a.routed_experts) == len(p) + len(a.completion_ids)
    assert all(
        len(t) == 4 and all(len(set(layer)) == 2 and max(layer) < 8 for layer in t) for t in a.routed_experts.tolist()
    )


async def test_bad_requests_are_refused_with_the_reason() -> None:
    engine = ScriptedEngine(SCRIPT, TOK, max_context=16)
    with pytest.raises(ContextLengthExceeded):
        await engine.generate(list(range(20)), SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        await engine.generate([1], SamplingParams(temperature=-1))
    with pytest.raises(ValueError, match="at least one completion"):
        ScriptedEngine([], TOK)
    with pytest.raises(ValueError, match="mode"):
        ScriptedEngine(SCRIPT, TOK, mode="random")


async def test_weight_updates_only_move_the_version() -> None:
    engine = ScriptedEngine(SCRIPT, TOK)
    await engine.update_weights_from_disk("/nonexistent", version=4)
    assert engine.policy_version == 4


async def test_many_concurrent_sessions_are_cheap() -> None:
    engine = ScriptedEngine(["word " * 100], TOK, mode="per_session")
    p = prompt(3)
    t0 = time.perf_counter()
    gens = await asyncio.gather(*[engine.generate(p, SamplingParams()) for _ in range(256)])
    elapsed = time.perf_counter() - t0
    assert all(len(g.completion_ids) == len(gens[0].completion_ids) for g in gens)
    assert engine.calls == 256
    assert elapsed < 30  # generous: a sanity bound, the benchmark measures the real cost
