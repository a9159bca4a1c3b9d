"""One GSPO step of SmolLM2-135M-Instruct through a real harness: examples/smollm2-calc.toml,
shrunk to one step of two rollouts (no warm start, no held-out), run by `legorl train`'s loop.

Checks what a real model adds to the tiny-model loop tests: the loss of a 49k-vocabulary
step is finite, and every recorded turn re-renders through SmolLM2's own chat template
(`apply_chat_template` on the request the harness sent) to exactly the prompt ids the engine
saw; every trajectory segment is its last turn's prompt + completion, every sampled token
trained exactly once, and a turn that ended on its end token is spliced into the next prompt.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from legorl.types import FinishReason
from tests.helpers.smollm2_util import MISSING, NAME, shrunk


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
@pytest.mark.usefixtures("one_thread_per_module")
def test_one_gspo_step_of_smollm2_through_mini_swe_agent(tmp_path: Path) -> None:
    from legorl.loop.train import train
    from legorl.models import load_tokenizer
    from legorl.store.run_store import RunStore

    summary = asyncio.run(train(shrunk(tmp_path / "run")))
    assert len(summary["steps"]) == 1
    tok = load_tokenizer(NAME)
    with RunStore(tmp_path / "run", readonly=True) as store:
        history = store.metrics_history()
        assert [h["step"] for h in history] == [0]
        assert math.isfinite(history[0]["train/loss"]) and history[0]["train/sampled_tokens"] > 0
        items = store.list_trajectories(limit=10)["items"]
        assert len(items) == 2
        for item in items:
            assert item["status"] not in ("infra_error", "engine_error", "sandbox_start_failed"), item
            turns = store.load_turns(item["session_id"])
            assert turns, item
            for t in turns:
                text = tok.apply_chat_template(t.request["messages"], add_generation_prompt=True, tokenize=False)
                assert tok.encode(text, add_special_tokens=False) == t.prompt_ids, (item["session_id"], t.index)
            traj = store.load_trajectory(item["session_id"])
            assert traj is not None and traj.segments
            for seg in traj.segments:  # each segment: its last turn's prompt + completion, sampled ids masked
                last = turns[seg.turn_indices[-1]]
                assert seg.token_ids == last.prompt_ids + last.completion_ids
                first = turns[seg.turn_indices[0]]
                assert seg.token_ids[: len(first.prompt_ids)] == first.prompt_ids
            sampled = sum(sum(seg.loss_mask) for seg in traj.segments)
            assert sampled == sum(len(t.completion_ids) for t in turns)  # every sampled token trained once
            for a, b in zip(turns, turns[1:], strict=False):
                if a.finish_reason is FinishReason.STOP:  # ended by its end token: spliced into the next prompt
                    assert b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
