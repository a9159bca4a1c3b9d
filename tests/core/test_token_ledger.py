"""Every sampled token trained, optionally, and a token ledger.

`[harness] side_calls = "train"` makes the side calls the policy answered (titles,
compaction summaries) segments of their own under the rollout's one advantage, and nothing
else changes; the ledger (legorl/ledger.py) says, per harness and step, where every sampled
token went (sampled = trained + each reason), in the metrics, the run store and the UI's
Outcomes view; an unknown option value is refused when the config loads."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
import torch

from legorl.config import ConfigError
from legorl.ledger import REASONS, TokenLedger, from_metrics, rollout_ledger, to_metrics
from legorl.loop.config import load_run_config
from legorl.loop.metrics import rollout_metrics, step_ledgers
from legorl.loop.record import RolloutAttempt, record_of
from legorl.models import load_tokenizer
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.renderer import ChatRequest, RenderState
from legorl.proxy.toolcalls import parse_completion
from legorl.rollout import RolloutResult
from legorl.store.run_store import RunStore
from legorl.train.batch import pack
from legorl.trajectory import assemble, delivered
from legorl.types import Dialect, FinishReason, Outcome, Status, Task, Turn
from tests.helpers.paths import ROOT

EXAMPLES = ROOT / "examples"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
COMPACT = "Do NOT call any tools. Respond with plain text only: summarise the conversation."


@pytest.fixture(scope="module")
def renderer() -> ChatMLRenderer:
    return ChatMLRenderer(load_tokenizer("tiny-qwen3"))


class Session:
    """Turns as the proxy records them, from a scripted policy through the real renderer."""

    def __init__(self, renderer: ChatMLRenderer) -> None:
        self.r, self.state, self.turns = renderer, RenderState(), []

    def call(self, msgs: list[dict], text: str, *, side: bool = False, tools: list | None = TOOLS) -> dict:
        prompt = self.r.render(ChatRequest(msgs, tools or []), self.state)
        completion = self.r.encode(text) + [self.r.im_end]
        parsed = parse_completion(text)
        if not side:  # the proxy splices back only a policy turn's ids
            self.state.remember(completion, parsed)
        lps = [-0.01 * (k + 1) for k in range(len(completion))]
        n = len(self.turns)
        self.turns.append(
            Turn("s", n, Dialect.OPENAI_CHAT, prompt, completion, lps, FinishReason.STOP, {}, side_call=side)
        )
        msg: dict = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            c = parsed.tool_calls[0]
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            ]
        return msg


def compacting_session(renderer: ChatMLRenderer) -> Session:
    """Two policy turns, a title call, a compaction summary (the history + an instruction, no
    tools: a side call), then the policy goes on from the summary; then a second summary."""
    s = Session(renderer)
    msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix calc.py"}]
    a = s.call(msgs, CALL)
    s.call([{"role": "system", "content": "You are a title generator"}, msgs[1]], "Fix calc", side=True, tools=None)
    msgs += [a, {"role": "tool", "tool_call_id": "x", "content": "calc.py test_calc.py"}]
    b = s.call(msgs, CALL.replace("ls", "cat calc.py"))
    msgs += [b, {"role": "tool", "tool_call_id": "y", "content": "def add(a, b): return a - b"}]
    s.call([*msgs, {"role": "user", "content": COMPACT}], "We listed and read calc.py; add subtracts.", side=True)
    summary = [{"role": "system", "content": "agent"}, {"role": "user", "content": "Summary: add subtracts. Go on."}]
    s.call(summary, CALL.replace("ls", "sed -i s/-/+/ calc.py"))
    s.call([*summary, {"role": "user", "content": COMPACT}], "Fixed add.", side=True)
    return s


def sampled(turns: list[Turn], *, side: bool) -> int:
    return sum(len(t.completion_ids) for t in turns if t.side_call == side)


def test_side_calls_are_trained_as_segments_only_when_asked(renderer: ChatMLRenderer) -> None:
    s = compacting_session(renderer)
    apart = assemble(s.turns)
    trained = assemble(s.turns, side_calls="train")
    side = [t.index for t in s.turns if t.side_call]
    assert apart.side_turns == trained.side_turns == side == [1, 3, 5]

    # separate (the default): only the policy's turns are in segments
    assert [seg.turn_indices for seg in apart.segments] == [[0, 2], [4]]
    assert apart.stats.side_calls == "separate" and apart.stats.side_segments == 0
    assert delivered(s.turns, apart) == {
        "policy_tokens": sampled(s.turns, side=False),
        "delivered_tokens": sampled(s.turns, side=False),
        "side_tokens": sampled(s.turns, side=True),
        "fraction": 1.0,
    }

    # train: the main conversation's segments unchanged and first, the side calls' after them
    assert trained.segments[:2] == apart.segments
    assert [seg.turn_indices for seg in trained.segments[2:]] == [[1], [3], [5]]
    assert trained.stats.side_segments == 3 and trained.stats.segments == 5
    assert trained.stats.first_divergence == apart.stats.first_divergence  # the main chain's, untouched
    for seg, turn in zip(trained.segments[2:], [s.turns[i] for i in side], strict=True):
        n = len(turn.prompt_ids)
        assert seg.token_ids == turn.prompt_ids + turn.completion_ids
        assert seg.loss_mask == [0] * n + [1] * len(turn.completion_ids)
        assert seg.logprobs[n:] == turn.logprobs
    total = sampled(s.turns, side=False) + sampled(s.turns, side=True)
    assert trained.stats.sampled_tokens == total
    assert delivered(s.turns, trained) == {
        "policy_tokens": total,
        "delivered_tokens": total,
        "side_tokens": 0,
        "fraction": 1.0,
    }


def test_a_trained_side_call_gets_the_rollouts_one_advantage(renderer: ChatMLRenderer) -> None:
    s = compacting_session(renderer)
    traj = dataclasses.replace(assemble(s.turns, side_calls="train"), outcome=Outcome(1.0, Status.RESOLVED))
    (mb,) = pack([(0, traj, 0.75)], "sequence", 1 << 20)
    lost = assemble(s.turns)
    (mb_apart,) = pack([(0, dataclasses.replace(lost, outcome=traj.outcome), 0.75)], "sequence", 1 << 20)
    on = mb.mask_N > 0
    assert int(on.sum()) == sampled(s.turns, side=False) + sampled(s.turns, side=True)
    assert int((mb_apart.mask_N > 0).sum()) == sampled(s.turns, side=False)
    assert torch.all(mb.advantages_N[on] == 0.75)
    side_ids = [i for t in s.turns if t.side_call for i in t.completion_ids]
    assert sorted(mb.targets_N[on].tolist()) == sorted(
        [i for t in s.turns if not t.side_call for i in t.completion_ids] + side_ids
    )
    assert len(mb.segment_lengths) == 5


def test_a_lost_side_call_is_counted_when_side_calls_train(renderer: ChatMLRenderer) -> None:
    """The delivered-fraction check counts what the trajectory now trains: a side segment gone
    missing is a loss under "train", and the ledger names it `unplaced`."""
    s = compacting_session(renderer)
    traj = assemble(s.turns, side_calls="train")
    broken = dataclasses.replace(traj, segments=traj.segments[:-1])  # the last summary dropped
    d = delivered(s.turns, broken)
    assert d["policy_tokens"] - d["delivered_tokens"] == len(s.turns[5].completion_ids) and d["fraction"] < 1.0
    led = rollout_ledger(s.turns, broken, fate=None)
    assert led.not_trained["unplaced"] == len(s.turns[5].completion_ids) and led.balanced


@pytest.mark.parametrize("side_calls", ["separate", "train"])
@pytest.mark.parametrize("fate", [None, "infra_mask", "zero_variance", "stale"])
def test_the_ledger_accounts_for_every_sampled_token(renderer: ChatMLRenderer, side_calls: str, fate: str) -> None:
    s = compacting_session(renderer)
    traj = assemble(s.turns, side_calls=side_calls)
    led = rollout_ledger(s.turns, traj, aborted_tokens=7, retried_tokens=11, fate=fate)
    policy, side = sampled(s.turns, side=False), sampled(s.turns, side=True)
    assert led.sampled == policy + side + 7 + 11
    assert led.sampled == led.trained + sum(led.not_trained.values()) and led.balanced
    assert led.not_trained["aborted"] == 7
    assert led.not_trained["side_call"] == (side if side_calls == "separate" else 0)
    reached = policy + (side if side_calls == "train" else 0)
    assert led.trained == (reached if fate is None else 0)
    for reason in ("infra_mask", "zero_variance", "stale"):
        assert led.not_trained[reason] == (reached if fate == reason else 0) + (11 if reason == "infra_mask" else 0)
    assert led.not_trained["unplaced"] == 0


def test_an_unknown_fate_or_mode_is_refused(renderer: ChatMLRenderer) -> None:
    s = compacting_session(renderer)
    with pytest.raises(ValueError, match="fate must be None or one of"):
        rollout_ledger(s.turns, assemble(s.turns), fate="lost")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="side_calls must be one of separate, train"):
        assemble(s.turns, side_calls="always")  # type: ignore[arg-type]


def record(
    turns: list[Turn], sid: str, harness: str, outcome: Outcome, side_calls: str, aborted: int = 0, retried: int = 0
):
    """A rollout's record as the worker builds it (loop/record.py: record_of)."""
    task = Task("calc-1", "calc", "abc", "fix it", "", "", [], [])
    result = RolloutResult("calc-1", harness, outcome)
    attempt = RolloutAttempt(sid, result, [dataclasses.replace(t, session_id=sid) for t in turns], 0)
    attempt = dataclasses.replace(attempt, aborted_tokens=aborted)
    return record_of(task, 3, attempt, [], side_calls, retried_tokens=retried)


def step_records(renderer: ChatMLRenderer) -> tuple[list, dict[str, float | None]]:
    """A step of two harnesses: claude-code trains its side calls, opencode keeps them apart;
    one rollout resolved, one failed, one masked (infra), one dropped as stale, one aborted call,
    one rollout that took a second attempt (the first lost to an infrastructure fault)."""
    turns = compacting_session(renderer).turns
    ok, bad = Outcome(1.0, Status.RESOLVED), Outcome(0.0, Status.FAILED)
    infra = Outcome(0.0, Status.INFRA_ERROR, masked=True)
    recs = [
        record(turns, "cc-0", "claude-code", ok, "train", aborted=5),
        record(turns, "cc-1", "claude-code", bad, "train"),
        record(turns, "oc-0", "opencode", ok, "separate", retried=9),
        record(turns, "oc-1", "opencode", infra, "separate"),
        record(turns, "oc-2", "opencode", bad, "separate"),
    ]
    advantages = {"cc-0": 0.7, "cc-1": -0.7, "oc-0": 0.7, "oc-1": None}  # oc-2: dropped as stale
    return recs, advantages


def test_a_steps_ledger_per_harness(renderer: ChatMLRenderer) -> None:
    recs, advantages = step_records(renderer)
    turns = recs[0].turns
    policy, side = sampled(turns, side=False), sampled(turns, side=True)
    assert recs[0].aborted_tokens == 5 and recs[0].trajectory.stats.side_calls == "train"
    led = step_ledgers(recs, advantages)
    assert set(led) == {"claude-code", "opencode"}
    assert all(x.balanced for x in led.values())
    cc, oc = led["claude-code"].as_dict(), led["opencode"].as_dict()
    assert cc == {"sampled": 2 * (policy + side) + 5, "trained": 2 * (policy + side), "aborted": 5} | {
        r: 0 for r in REASONS if r != "aborted"
    }
    assert oc["sampled"] == 3 * (policy + side) + 9 and oc["trained"] == policy
    assert (oc["side_call"], oc["infra_mask"], oc["stale"], oc["zero_variance"]) == (3 * side, policy + 9, policy, 0)
    # the step's metrics carry it, one key per harness and column
    m = rollout_metrics(recs, 0, None, advantages)
    assert m["ledger/claude-code/trained"] == cc["trained"] and m["ledger/opencode/stale"] == policy
    assert from_metrics(m) == led
    assert not any(k.startswith("ledger/") for k in rollout_metrics(recs, 0, None))  # nothing given, no ledger


def test_the_ledger_round_trips_through_the_run_store(tmp_path: Path, renderer: ChatMLRenderer) -> None:
    recs, advantages = step_records(renderer)
    led = step_ledgers(recs, advantages)
    with RunStore(tmp_path / "run") as store:
        store.log_metrics(3, rollout_metrics(recs, 0, None, advantages))
        store.log_metrics(4, to_metrics(led))
        one = store.token_ledger(3)
        assert one["steps"] == 1 and one["reasons"] == list(REASONS)
        assert {h: TokenLedger.from_dict(r) for h, r in one["harnesses"].items()} == led
        assert all(r["balanced"] for r in one["harnesses"].values()) and one["total"]["balanced"]
        both = store.token_ledger()
        assert both["steps"] == 2
        assert both["total"]["sampled"] == 2 * sum(x.sampled for x in led.values())
        assert both["harnesses"]["opencode"]["side_call"] == 2 * led["opencode"].not_trained["side_call"]
        assert store.token_ledger(9)["harnesses"] == {}


def test_the_stored_trajectory_keeps_its_side_segments(tmp_path: Path, renderer: ChatMLRenderer) -> None:
    from legorl.loop.run import record as store_records

    recs, _ = step_records(renderer)
    with RunStore(tmp_path / "run") as store:
        store_records(store, recs[:1], renderer.tokenizer)
        back = store.load_trajectory("cc-0")
        view = store.get_trajectory("cc-0")
    assert back is not None and back.stats == recs[0].trajectory.stats
    assert [s.turn_indices for s in back.segments] == [s.turn_indices for s in recs[0].trajectory.segments]
    assert delivered(recs[0].turns, back)["fraction"] == 1.0
    side = {t["index"]: t["segment"] for t in view["turns"] if t["side_call"]}
    assert side == {1: 2, 3: 3, 5: 4}  # each side call shown in its own trained segment


def test_an_unknown_side_calls_value_fails_at_config_load(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('[harness]\nname = "opencode"\nside_calls = "always"\n')
    with pytest.raises(ConfigError) as e:
        load_run_config(cfg)
    # the file's header line, then one line: the field, what it takes, what it got
    assert str(e.value).splitlines()[1:] == [
        "  harness.side_calls: Input should be 'separate' or 'train' (got 'always')"
    ]


def test_the_codex_config_trains_its_compaction_summaries() -> None:
    assert load_run_config(EXAMPLES / "swebench-codex.toml").harness.side_calls == "train"
    assert load_run_config(EXAMPLES / "swebench-opencode.toml").harness.side_calls == "separate"


def test_the_outcomes_view_shows_the_ledger(tmp_path: Path, renderer: ChatMLRenderer) -> None:
    """In a real headless Chromium: the Outcomes view of a step draws the ledger's numbers."""
    from legorl.monitor.ui.server import UIServerThread

    recs, advantages = step_records(renderer)
    led = step_ledgers(recs, advantages)
    with RunStore(tmp_path / "run") as store:
        store.begin_step(3, policy_version=0)
        store.log_metrics(3, rollout_metrics(recs, 0, None, advantages))
        store.end_step(3)
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("LEGORL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian chromium is not installed: run `bash scripts/setup_ui.sh` (or set LEGORL_CHROMIUM)"
    with UIServerThread(tmp_path / "run", poll_interval=0.2) as srv, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, timeout=60_000)
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(srv.url + "#/outcomes?step=3")
        page.wait_for_selector(".ledger-table tr[data-harness='opencode']", timeout=15_000)
        for harness, expected in led.items():
            row = page.locator(f".ledger-table tr[data-harness='{harness}']")
            for col, value in expected.as_dict().items():
                assert row.locator(f"td[data-col='{col}']").inner_text().split(" ")[0] == str(value), (harness, col)
            assert row.locator("td[data-col='balanced']").inner_text() == "100%"
        total = page.locator(".ledger-table tr[data-harness='all'] td[data-col='sampled']").inner_text()
        assert total == str(sum(x.sampled for x in led.values()))
        browser.close()
    assert not errors, errors


SIDE_CALL_AGENT = """#!/bin/bash
# Asks the policy twice (one conversation), and once for a title (a side call by the default
# patterns), through the proxy.
python3 - <<'PY'
import json, os, urllib.request
base = os.environ["OPENAI_BASE_URL"]
def ask(msgs):
    body = {"model": "policy", "messages": msgs, "max_tokens": 12}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["message"]
msgs = [{"role": "user", "content": "fix calc.py"}]
msgs += [ask(msgs), {"role": "user", "content": "continue"}]
ask([{"role": "system", "content": "You are a title generator"}, {"role": "user", "content": "fix calc.py"}])
ask(msgs)
PY
"""


@pytest.mark.slow
def test_a_run_that_trains_its_side_calls_accounts_for_every_token(tmp_path: Path) -> None:
    """`legorl train` with `side_calls = "train"`: each stored trajectory holds its title call
    as a segment, and the run store's ledger counts every sampled token as trained."""
    from tests.helpers.loop_util import train, write_run

    config = write_run(tmp_path, group_size=2)
    (tmp_path / "agent.sh").write_text(SIDE_CALL_AGENT)
    config.write_text(
        config.read_text().replace('command_file = "agent.sh"', 'command_file = "agent.sh"\nside_calls = "train"')
    )
    proc = train(config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with RunStore(tmp_path / "run") as store:
        sids = list(store.iter_session_ids())
        assert len(sids) == 4
        sampled_tokens = 0
        for sid in sids:
            turns, traj = store.load_turns(sid), store.load_trajectory(sid)
            assert traj is not None and traj.outcome is not None and not traj.outcome.masked
            assert len(traj.side_turns) == 1 and traj.stats.side_segments == 1
            assert traj.segments[-1].turn_indices == traj.side_turns
            assert delivered(turns, traj)["fraction"] == 1.0
            sampled_tokens += sum(len(t.completion_ids) for t in turns)
        ledger = store.token_ledger()
    assert ledger["steps"] == 2 and list(ledger["harnesses"]) == ["command"]
    row = ledger["harnesses"]["command"]
    assert row["balanced"] and row["sampled"] == sampled_tokens > 0
    assert row["trained"] == sampled_tokens and row["side_call"] == 0  # zero_variance_groups = "keep": all trained
