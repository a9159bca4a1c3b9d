"""Assembly: one segment for an append-only run; compaction and re-serialisation start new
segments; no sampled token is ever lost or mislabelled."""

from __future__ import annotations

import pytest

from legorl.models import load_tokenizer
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.renderer import ChatRequest, RenderState
from legorl.proxy.toolcalls import parse_completion
from legorl.trajectory import assemble, delivered
from legorl.types import Dialect, FinishReason, Turn

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def renderer() -> ChatMLRenderer:
    return ChatMLRenderer(load_tokenizer("tiny-qwen3"))


class Harness:
    """Drives the renderer the way the proxy does, with a scripted policy."""

    def __init__(self, renderer: ChatMLRenderer) -> None:
        self.r, self.state, self.turns = renderer, RenderState(), []

    def call(self, msgs: list[dict], text: str) -> dict:
        prompt = self.r.render(ChatRequest(msgs, TOOLS), self.state)
        completion = self.r.encode(text) + [self.r.im_end]
        parsed = parse_completion(text)
        self.state.remember(completion, parsed)
        n = len(self.turns)
        self.turns.append(
            Turn(
                "s",
                n,
                Dialect.OPENAI_CHAT,
                prompt,
                completion,
                [-0.1 * (k + 1) for k in range(len(completion))],
                FinishReason.STOP,
                {},
            )
        )
        msg = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in parsed.tool_calls
            ]
        return msg


def _sampled(turns: list[Turn]) -> list[int]:
    return [i for t in turns for i in t.completion_ids]


def _masked_ids(traj) -> list[int]:
    return [i for s in traj.segments for i, m in zip(s.token_ids, s.loss_mask) if m]


CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


def test_multi_turn_is_one_segment(renderer: ChatMLRenderer) -> None:
    h = Harness(renderer)
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
    for k in range(4):
        a = h.call(msgs, CALL.replace("ls", f"ls {k}"))
        # OpenHands-style re-serialised arguments must still align (splicing)
        a["tool_calls"][0]["function"]["arguments"] = a["tool_calls"][0]["function"]["arguments"].replace(": ", ":")
        msgs += [a, {"role": "tool", "tool_call_id": a["tool_calls"][0]["id"], "content": f"out {k}"}]
    h.call(msgs, "Done.")
    traj = assemble(h.turns)
    assert traj.stats.segments == 1
    assert _masked_ids(traj) == _sampled(h.turns)
    assert traj.stats.reused_prompt_tokens > 0 and traj.stats.first_divergence is None
    seg = traj.segments[0]
    assert [lp for lp, m in zip(seg.logprobs, seg.loss_mask) if m] == [lp for t in h.turns for lp in t.logprobs]


def test_compaction_starts_new_segment_and_loses_nothing(renderer: ChatMLRenderer) -> None:
    h = Harness(renderer)
    msgs = [{"role": "user", "content": "fix it"}]
    a = h.call(msgs, CALL)
    msgs += [a, {"role": "tool", "tool_call_id": "x", "content": "a.py b.py"}]
    h.call(msgs, CALL.replace("ls", "cat a.py"))
    # the harness summarises its history (Claude Code / OpenCode style)
    msgs = [{"role": "user", "content": "Summary: we listed files and read a.py. Continue."}]
    h.call(msgs, "Finished.")
    traj = assemble(h.turns)
    assert traj.stats.segments == 2
    assert _masked_ids(traj) == _sampled(h.turns)
    assert traj.stats.first_divergence["turn"] == 2  # diverges right after the shared system+tools header
    assert 0 < traj.stats.first_divergence["token"] < len(h.turns[2].prompt_ids)


def test_reserialised_assistant_message_starts_new_segment(renderer: ChatMLRenderer) -> None:
    h = Harness(renderer)
    msgs = [{"role": "user", "content": "hello"}]
    a = h.call(msgs, "Let me look.  ")
    a["content"] = "Let me take a look."  # the harness rewrote what the model said
    msgs += [a, {"role": "user", "content": "go on"}]
    h.call(msgs, "OK.")
    traj = assemble(h.turns)
    assert traj.stats.segments == 2
    assert _masked_ids(traj) == _sampled(h.turns)
    assert traj.stats.first_divergence["turn"] == 1


def test_interleaved_sub_agent_keeps_its_own_segment(renderer: ChatMLRenderer) -> None:
    """A parent calls a sub-agent tool; the sub-agent's turns come between the parent's
    (one session): the parent's chain stays one segment, the sub-agent's is another."""
    h = Harness(renderer)
    main = [{"role": "system", "content": "main agent"}, {"role": "user", "content": "fix it"}]
    a = h.call(main, CALL.replace("ls", "delegate"))
    sub = [{"role": "system", "content": "sub-agent"}, {"role": "user", "content": "fix it for the parent"}]
    for k in range(2):
        b = h.call(sub, CALL.replace("ls", f"ls {k}"))
        sub += [b, {"role": "tool", "tool_call_id": b["tool_calls"][0]["id"], "content": f"out {k}"}]
    h.call(sub, "Fixed.")
    main += [a, {"role": "tool", "tool_call_id": a["tool_calls"][0]["id"], "content": "Fixed."}]
    h.call(main, "Done.")
    traj = assemble(h.turns)
    assert [s.turn_indices for s in traj.segments] == [[0, 4], [1, 2, 3]]
    assert sorted(_masked_ids(traj)) == sorted(_sampled(h.turns))
    assert delivered(h.turns, traj) == {
        "policy_tokens": len(_sampled(h.turns)),
        "delivered_tokens": len(_sampled(h.turns)),
        "side_tokens": 0,
        "fraction": 1.0,
    }


def test_delivered_counts_a_lost_turn(renderer: ChatMLRenderer) -> None:
    h = Harness(renderer)
    msgs = [{"role": "user", "content": "hi"}]
    a = h.call(msgs, CALL)
    h.call(msgs + [a, {"role": "tool", "tool_call_id": "x", "content": "ok"}], "Done.")
    traj = assemble(h.turns)
    traj.segments[0].loss_mask[-1] = 0  # the last sampled token of turn 1 no longer reaches the loss
    d = delivered(h.turns, traj)
    assert d["delivered_tokens"] == len(h.turns[0].completion_ids) and d["fraction"] < 1.0


def test_side_calls_are_excluded(renderer: ChatMLRenderer) -> None:
    h = Harness(renderer)
    h.call([{"role": "user", "content": "hi"}], "Hello.")
    h.call([{"role": "user", "content": "Generate a title"}], "Title")
    h.turns[1].side_call = True
    traj = assemble(h.turns)
    assert traj.side_turns == [1] and traj.stats.segments == 1


def test_inconsistent_turn_is_rejected() -> None:
    t = Turn("s", 0, Dialect.ANTHROPIC, [1, 2], [3, 4], [-1.0], FinishReason.STOP, {})
    with pytest.raises(ValueError, match="1 logprobs for 2 completion ids"):
        assemble([t])
