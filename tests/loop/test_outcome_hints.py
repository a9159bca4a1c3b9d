"""Why a rollout stopped, on its outcome: a prompt the proxy refused as over the model's window
(`context_exceeded`, graded as it stands, never a 5xx), a harness that exited before its first
model call (`exited_before_first_call`, with its last output as the hint), and the turn
figures `legorl eval` reports beside its pass rate (action and parse shares, prompt tokens
and seconds per turn, delivered fraction)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from legorl.engine.scripted import ScriptedEngine
from legorl.harness.actions import format_of
from legorl.harness.base import AgentRun
from legorl.loop.config import RunConfig
from legorl.loop.evaluate import turn_summary
from legorl.loop.record import CONTEXT_FLAG, NO_FIRST_CALL, SILENT_EXIT_FLAG, RolloutAttempt, outcome_of
from legorl.loop.worker import RolloutWorker
from legorl.models import load_tokenizer
from legorl.rollout import RolloutResult
from legorl.tasks.loader import load_shipped
from legorl.types import Outcome, Status
from tests.helpers.worker_util import AGENT

# an agent whose first request does not fit a 256-token window: it reports the proxy's answer
OVERFLOW_AGENT = """#!/bin/bash
python3 - <<'PY'
import json, os, urllib.error, urllib.request
body = {"model": "m", "messages": [{"role": "user", "content": "word " * 2000}], "max_tokens": 4}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
                             headers={"content-type": "application/json"})
try:
    urllib.request.urlopen(req, timeout=60)
except urllib.error.HTTPError as e:
    err = json.load(e)["error"]
    print(e.code, err["code"])
PY
"""


def worker_cfg(tmp_path: Path, agent: str, **proxy: object) -> RunConfig:
    (tmp_path / "agent.sh").write_text(agent)
    return RunConfig.model_validate(
        {
            "harness": {"name": "command", "command_file": str(tmp_path / "agent.sh")},
            "sandbox": {"retries": 0, "agent_timeout_s": 120},
            "proxy": proxy,
        }
    )


async def test_a_prompt_over_the_window_is_a_4xx_and_a_graded_outcome_flagged_context_exceeded(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path, OVERFLOW_AGENT, max_context=256)
    engine = ScriptedEngine(["never sampled"], load_tokenizer("tiny-qwen3"))
    async with RolloutWorker(cfg, engine) as w:
        rec = await w.rollout(load_shipped("train")[0], step=0, session_id="over")
    out = rec.trajectory.outcome
    assert CONTEXT_FLAG in out.flags and out.evidence["context_errors"] == 1
    assert not out.masked and out.status is Status.NO_PATCH  # the agent's doing: graded, not retried
    assert "400 context_length_exceeded" in rec.result.agent.stdout_tail  # what the harness was told
    assert rec.turns == [] and SILENT_EXIT_FLAG not in out.flags  # the refusal is the reason, not a crash


async def test_turn_summary_counts_the_policys_turns_by_the_harness_format(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path, AGENT + AGENT)  # two model calls
    engine = ScriptedEngine(["hello", "again"], load_tokenizer("tiny-qwen3"))
    async with RolloutWorker(cfg, engine) as w:
        rec = await w.rollout(load_shipped("train")[0], step=0, session_id="two")
        fmt = format_of(w.harness)
    s = turn_summary([rec], fmt)
    assert s["count"] == 2 == len(rec.turns) and s["per_rollout"] == 2.0
    assert s["prompt_tokens"] == sum(len(t.prompt_ids) for t in rec.turns) / 2
    assert s["completion_tokens"] == sum(len(t.completion_ids) for t in rec.turns) / 2
    assert s["seconds"] is not None and s["seconds"] >= 0
    assert s["delivered_fraction"] == 1.0
    assert s["action_share"] == sum(fmt.acts(t) for t in rec.turns) / 2
    assert s[CONTEXT_FLAG] == 0 and s[SILENT_EXIT_FLAG] == 0
    assert turn_summary([], fmt)["count"] == 0 and turn_summary([], fmt)["action_share"] is None


def test_a_harness_that_exits_before_its_first_call_says_why() -> None:
    said = "Error: model 'legorl-policy' has no context window in the catalogue\n"
    result = RolloutResult("i", "codex", Outcome(0.0, Status.NO_PATCH), agent=AgentRun(1, stderr_tail=said))
    out = outcome_of(RolloutAttempt("s", result, [], engine_errors=0), [])
    assert out.status is Status.NO_PATCH and SILENT_EXIT_FLAG in out.flags
    assert out.evidence["agent_output_tail"] == said.strip()
    quiet = dataclasses.replace(result, agent=AgentRun(2))
    assert outcome_of(RolloutAttempt("s", quiet, [], 0), []).evidence["agent_output_tail"] == "exit status 2, no output"
    clean = dataclasses.replace(result, agent=AgentRun(0, stderr_tail=said))  # exit 0: nothing to explain
    assert SILENT_EXIT_FLAG not in outcome_of(RolloutAttempt("s", clean, [], 0), []).flags
    refused = RolloutAttempt("s", result, [], 0, context_errors=1)  # the window explains it
    assert outcome_of(refused, []).flags == [CONTEXT_FLAG]


def test_a_timeout_before_any_model_call_reached_the_session_is_ours_and_keeps_the_harness_output() -> None:
    """The policy was never asked anything, so the time went to the harness's start or to a
    request lost on its way: masked and retried, with the harness's tails to say which. A first
    call that reached the session and was still unanswered stays the agent's timeout."""
    run = AgentRun(124, timed_out=True, stdout_tail='{"type":"system","subtype":"init"}\n', stderr_tail="")
    result = RolloutResult("i", "claude-code", Outcome(0.0, Status.AGENT_TIMEOUT), agent=run)
    never = RolloutAttempt("s", result, [], engine_errors=0, requests=0)
    assert never.infra_cause == NO_FIRST_CALL
    out = outcome_of(never, [])
    assert out.status is Status.INFRA_ERROR and out.masked and out.evidence["cause"] == NO_FIRST_CALL
    assert out.evidence["agent_output_tail"] == 'stdout: {"type":"system","subtype":"init"}'
    assert SILENT_EXIT_FLAG not in out.flags  # it did not exit: it was killed
    asked = RolloutAttempt("s", result, [], engine_errors=0, requests=1)  # its first call was in flight
    out = outcome_of(asked, [])
    assert asked.infra_cause is None and out.status is Status.AGENT_TIMEOUT and not out.masked
    assert out.evidence["agent_output_tail"].startswith("stdout: ")
    relayed = RolloutAttempt("s", result, [], engine_errors=0)  # an external endpoint: we cannot know
    assert relayed.infra_cause is None
    mute = dataclasses.replace(result, agent=AgentRun(124, timed_out=True))
    assert outcome_of(RolloutAttempt("s", mute, [], 0), []).evidence["agent_output_tail"] == "no output"


async def test_a_harness_that_never_calls_the_model_before_its_timeout_is_retried_then_masked(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path, "#!/bin/bash\necho starting; sleep 60\n")
    cfg.sandbox.agent_timeout_s = 2
    cfg.sandbox.retries = 1
    engine = ScriptedEngine(["never sampled"], load_tokenizer("tiny-qwen3"))
    async with RolloutWorker(cfg, engine) as w:
        rec = await w.rollout(load_shipped("train")[0], step=0, session_id="mute")
    out = rec.trajectory.outcome
    assert out.status is Status.INFRA_ERROR and out.masked and out.evidence["cause"] == NO_FIRST_CALL, out
    assert out.evidence["retried_after"] == [f"mute: {NO_FIRST_CALL}"]
    assert "starting" in out.evidence["agent_output_tail"]
    cfg = worker_cfg(tmp_path, AGENT + "sleep 60\n")  # one model call answered, then it hangs: its own
    cfg.sandbox.agent_timeout_s = 4
    async with RolloutWorker(cfg, ScriptedEngine(["hello"], load_tokenizer("tiny-qwen3"))) as w:
        rec = await w.rollout(load_shipped("train")[0], step=0, session_id="slow")
    assert rec.trajectory.outcome.status is Status.AGENT_TIMEOUT and not rec.trajectory.outcome.masked


class MuteHostHarness:
    """A harness process beside the sandboxes that never reaches its session (wedged)."""

    name = "mute-host"

    def __init__(self) -> None:
        self.driver = dataclasses.make_dataclass("Proc", [("proc", object, None)])()
        self.retired = 0

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    async def retire(self) -> None:
        self.retired += 1

    async def run(self, sb: object, task: object, proxy_url: str | None, repo_dir: str, timeout_s: float) -> AgentRun:
        return AgentRun(124, timed_out=True, status=Status.AGENT_TIMEOUT, stderr_tail="waiting on a lock")


async def test_a_host_harness_that_never_reaches_its_session_is_retired_before_each_retry(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path, AGENT)
    cfg.sandbox.retries = 1
    async with RolloutWorker(cfg, ScriptedEngine(["never sampled"], load_tokenizer("tiny-qwen3"))) as w:
        w.harness = mute = MuteHostHarness()
        rec = await w.rollout(load_shipped("train")[0], step=0, session_id="wedged")
    out = rec.trajectory.outcome
    assert out.status is Status.INFRA_ERROR and out.masked and out.evidence["cause"] == NO_FIRST_CALL, out
    assert mute.retired == 2 and out.evidence["agent_output_tail"] == "stderr: waiting on a lock"
