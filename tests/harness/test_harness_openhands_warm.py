"""The warm OpenHands harness: one long-lived SDK process, the SDK's own agent and tools,
every terminal command and file edit in the rollout's sandbox, model calls to the rollout's
own proxy session — driven through RolloutWorker like every rollout of `legorl train`.

The oracle engine resolving shipped tasks through it (both backends, a forced
condensation, the tiny hf model) is in test_harness_e2e.py with the other harnesses; here:
where the actions run, what the model is shown, and the faults."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid

import pytest

from legorl.engine.registry import EngineConfig, make_engine
from legorl.loop.worker import RolloutWorker
from legorl.models import load_tokenizer
from legorl.types import Status
from tests.helpers.harness_util import Setup, harness_missing, rollouts, run_config, shipped, summary

pytestmark = pytest.mark.harness


def setup_module() -> None:
    if why := harness_missing("openhands-warm"):  # CI builds the layers first: a broken set-up
        pytest.fail(why)


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


FINISH = call("finish", message="done")


def scripted(*completions: str) -> object:
    cfg = EngineConfig(
        kind="scripted", model="tiny-qwen3", scripted_completions=list(completions), scripted_mode="per_session"
    )
    return make_engine(cfg, load_tokenizer("tiny-qwen3"))


def seen(rec: object, turn: int) -> str:
    """What the model was shown at `turn` (its prompt, decoded)."""
    return load_tokenizer("tiny-qwen3").decode(rec.turns[turn].prompt_ids)  # type: ignore[attr-defined]


async def test_actions_run_in_the_sandbox_and_the_model_sees_sandbox_paths_only() -> None:
    name = f"legorl-host-{uuid.uuid4().hex}"
    marker = f"/tmp/{name}"
    # a directory whose name ends in a newline: the editor's listing of /repo then holds a
    # line "/NAME-listed", which must not become a path on the host
    newline_dir = """d="$(printf 'x\\n_')"; d="${d%_}"; mkdir "$d" && touch "$d/""" + f'{name}-listed" && '
    engine = scripted(
        call(
            "terminal",
            command=f"touch {marker} && {newline_dir} mkdir -p sub && cd sub && export LEGORL_X=kept && ls /",
        ),
        call("terminal", command="pwd; echo x=$LEGORL_X; (exit 3)"),
        call("file_editor", command="create", path=f"{marker}-edited", file_text="made by the editor\n"),
        call("file_editor", command="create", path="/repo/../repo/NEW.txt", file_text="one\ntwo\n"),
        call("file_editor", command="str_replace", path="/repo/NEW.txt", old_str="two", new_str="three"),
        call("file_editor", command="view", path="/repo"),
        call("terminal", command=f"cat {marker}-edited /repo/NEW.txt"),
        FINISH,
    )
    rec = (await rollouts(Setup("openhands-warm", max_turns=12), shipped(1), engine=engine))[0]
    assert rec.result.agent.details.get("status") == "finished", summary(rec)
    for host_path in (marker, f"{marker}-edited", f"/{name}-listed"):  # the sandbox's /tmp only; a
        assert not os.path.exists(host_path)  # file name with a newline does not escape the mirror
    first, second = seen(rec, 1), seen(rec, 2)
    assert "bin" in first and "[The command completed with exit code 0.]" in first  # the sandbox's `ls /`
    assert "[Current working directory: /repo/sub]" in second and "x=kept" in second  # the shell's state carries
    assert "[The command completed with exit code 3.]" in seen(rec, 3)
    last = seen(rec, 7)
    assert "made by the editor" in last and "one\nthree" in last  # the editor's files, read by the terminal
    assert "Here's the files and directories up to 2 levels deep in /repo" in last  # the SDK's own listing
    assert "The file /repo/NEW.txt has been edited" in last
    assert "Your current working directory is: /repo" in seen(rec, 0)  # the SDK's tool description
    assert "legorl-openhands" not in last  # no host path of the mirror reaches the model
    diff = rec.trajectory.outcome.evidence["diff"]
    assert "NEW.txt" in diff and "+three" in diff  # the edit is in the sandbox's repository


async def test_agent_timeout_and_a_killed_driver() -> None:
    """A command that outlives the rollout's limit → agent_timeout (graded, not masked); the
    driver killed mid-rollout → infra_error (masked), and the next rollout starts a new one."""
    engine = scripted(call("terminal", command="echo started; sleep 60", timeout=120), FINISH)
    setup = Setup("openhands-warm", timeout_s=15)  # past the first model call: a timeout before it is ours
    cfg = run_config(setup)
    try:
        async with RolloutWorker(cfg, engine) as w:
            task = shipped(1)[0]
            rec = await asyncio.wait_for(w.rollout(task), 120)
            o = rec.trajectory.outcome
            assert o.status is Status.AGENT_TIMEOUT and not o.masked, summary(rec)
            pending = asyncio.create_task(w.rollout(task))
            for _ in range(200):  # until its command runs in the sandbox
                await asyncio.sleep(0.1)
                if w.harness.driver.in_flight:
                    break
            os.killpg(w.harness.driver.proc.pid, signal.SIGKILL)
            rec = await asyncio.wait_for(pending, 60)
            o = rec.trajectory.outcome
            assert o.status is Status.INFRA_ERROR and o.masked, summary(rec)
            again = await asyncio.wait_for(w.rollout(task), 120)  # a fresh driver; the limit again
            assert again.trajectory.outcome.status is Status.AGENT_TIMEOUT, summary(again)
    finally:
        await engine.close()


async def test_the_driver_is_recycled_between_rollouts() -> None:
    """`recycle_after` rollouts, and the next one runs on a fresh driver (bounding its memory)."""
    cfg = run_config(Setup("openhands-warm", options={"recycle_after": 1}))
    engine = make_engine(EngineConfig.model_validate(cfg.engine.model_dump()), load_tokenizer("tiny-qwen3"))
    pids = []
    try:
        async with RolloutWorker(cfg, engine) as w:
            for task in shipped(2):
                pids.append(w.harness.driver.proc.pid if w.harness.driver.proc else None)
                rec = await w.rollout(task)
                assert rec.trajectory.outcome.status is Status.RESOLVED, summary(rec)
            assert w.harness.driver.proc is None  # retired after its one rollout
    finally:
        await engine.close()
    assert pids[0] is not None and pids[1] is None  # the second rollout started a new one


async def test_a_retired_driver_is_replaced_once_no_rollout_runs_on_it() -> None:
    """`retire` (what the worker calls when a rollout ran out its time before one model call:
    the driver may be wedged) stops an idle driver at once, and a busy one only after its last
    rollout ends: the rollouts running on it are not failed for it."""
    cfg = run_config(Setup("openhands-warm"))
    engine = make_engine(EngineConfig.model_validate(cfg.engine.model_dump()), load_tokenizer("tiny-qwen3"))
    try:
        async with RolloutWorker(cfg, engine) as w:
            first, second = shipped(2)
            pending = asyncio.create_task(w.rollout(first))
            for _ in range(600):  # until the rollout runs on the driver
                await asyncio.sleep(0.05)
                if w.harness.driver.rollouts:
                    break
            busy = w.harness.driver.proc
            await w.harness.retire()
            assert w.harness.driver.proc is busy and busy.returncode is None  # its rollout still runs on it
            rec = await asyncio.wait_for(pending, 120)
            assert rec.trajectory.outcome.status is Status.RESOLVED, summary(rec)
            assert w.harness.driver.proc is None and busy.returncode is not None  # stopped once idle
            rec = await asyncio.wait_for(w.rollout(second), 120)
            assert rec.trajectory.outcome.status is Status.RESOLVED, summary(rec)
            idle = w.harness.driver.proc
            assert idle is not None and idle.pid != busy.pid
            await w.harness.retire()
            assert w.harness.driver.proc is None and idle.returncode is not None  # idle: at once
    finally:
        await engine.close()


async def test_a_run_secret_that_begins_with_a_dash_still_reaches_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's secret is URL-safe base64: one in 64 begins with "-". Passed as a separate
    argument, argparse read it as an option, the conversation never started, and every rollout
    of that run waited out its timeout (found by CI through the mixed config's demonstrations)."""
    import secrets

    import legorl.loop.worker as worker

    monkeypatch.setattr(worker, "new_token", lambda: "-" + secrets.token_urlsafe(32))
    cfg = run_config(Setup("openhands-warm", timeout_s=120))
    engine = make_engine(EngineConfig.model_validate(cfg.engine.model_dump()), load_tokenizer("tiny-qwen3"))
    try:
        async with RolloutWorker(cfg, engine) as w:
            assert w.proxy.secret.startswith("-")
            rec = await asyncio.wait_for(w.rollout(shipped(1)[0]), 120)
        assert rec.trajectory.outcome.status is Status.RESOLVED, summary(rec)
    finally:
        await engine.close()


async def test_options_the_driver_cannot_read_end_the_rollout_at_once_as_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse exits (SystemExit) on what it cannot read; the driver reports that as a crash
    straight away instead of leaving the host to wait for the rollout until its timeout."""
    from legorl.harness.openhands_warm import WarmOpenHands

    monkeypatch.setattr(WarmOpenHands, "_argv", lambda self, base_url: ["--no-such-option"])
    cfg = run_config(Setup("openhands-warm", timeout_s=300))
    engine = scripted(FINISH)
    try:
        async with RolloutWorker(cfg, engine) as w:
            t0 = time.monotonic()
            rec = await asyncio.wait_for(w.rollout(shipped(1)[0]), 120)
        o = rec.trajectory.outcome
        assert o.status is Status.INFRA_ERROR and o.masked, summary(rec)
        assert "SystemExit" in str(o.evidence), o.evidence
        assert time.monotonic() - t0 < 60  # not the 300-s limit
    finally:
        await engine.close()
