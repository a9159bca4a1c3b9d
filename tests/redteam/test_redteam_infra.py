"""Issue 39's attacks on the infrastructure, through a real rollout worker (scripted engine,
real proxy, real sandboxes): an agent cannot escape its zero by making our side look faulty,
and a local process without the run's secret cannot reach into a live rollout."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from legorl.loop.record import AGENT_FAULTS_FLAG, SESSION_CLOSED
from legorl.loop.worker import RolloutWorker
from legorl.tasks.loader import load_shipped
from legorl.types import Status
from tests.helpers.backends import BACKENDS
from tests.helpers.redteam_infra import FLOOD, MISBEHAVE, ONE_CALL, WAIT, Hung, OneAtATime, engine, run_config


@pytest.mark.parametrize("backend", BACKENDS)
async def test_flooding_its_own_session_is_the_agents(tmp_path: Path, backend: str) -> None:
    """24 concurrent long generations against an engine that serves one at a time: past the
    session's limit they get 429s, and the admitted ones that time out queued behind their own
    siblings are the agent's. No fix was made: reward 0, graded, flagged — never masked."""
    cfg = run_config(tmp_path, FLOOD.format(n=24), backend, request_timeout_s=2, session_max_concurrency=6)
    async with RolloutWorker(cfg, engine(OneAtATime, 0.6)) as w:
        rec = await w.rollout(load_shipped("train")[0], session_id="flood")
    o = rec.trajectory.outcome
    faults = o.evidence.get("agent_faults", {})
    assert o.status is Status.NO_PATCH and not o.masked and o.reward == 0.0, (o.status, o.evidence)
    assert AGENT_FAULTS_FLAG in o.flags and faults.get("concurrency_limit", 0) >= 1, o.evidence
    assert faults.get("own_load", 0) >= 1, o.evidence  # timed out queued behind its own calls
    assert "retried_after" not in o.evidence  # not even retried: nothing of ours failed


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_engine_that_hangs_for_a_lone_call_still_masks(tmp_path: Path, backend: str) -> None:
    """The other side of the rule: one call alone that times out is the engine's fault (ours):
    retried, then masked, never a reward of 0."""
    cfg = run_config(tmp_path, ONE_CALL, backend, request_timeout_s=1)
    async with RolloutWorker(cfg, engine(Hung)) as w:
        rec = await w.rollout(load_shipped("train")[0], session_id="hung")
    o = rec.trajectory.outcome
    assert o.status is Status.INFRA_ERROR and o.masked and o.evidence["cause"] == "engine_error", o.evidence
    assert AGENT_FAULTS_FLAG not in o.flags


@pytest.mark.parametrize("backend", BACKENDS)
async def test_breaking_the_conversation_from_the_client_side_is_never_ours(tmp_path: Path, backend: str) -> None:
    """A WebSocket upgrade, non-HTTP bytes, a body that never arrives and streams hung up after
    their first bytes: each is answered (4xx) or aborted, none counts as an engine fault."""
    cfg = run_config(tmp_path, MISBEHAVE, backend, body_timeout_s=1)
    async with RolloutWorker(cfg, engine(OneAtATime, 0.0)) as w:
        rec = await w.rollout(load_shipped("train")[0], session_id="rude")
    o = rec.trajectory.outcome
    assert o.status is Status.NO_PATCH and not o.masked and "retried_after" not in o.evidence, o.evidence
    assert rec.result.agent is not None
    answers = rec.result.agent.stdout_tail.splitlines()
    assert [a[:12] for a in answers[:3]] == ["b'HTTP/1.1 4"] * 3, answers  # upgrade, garbage, slow body


async def _live_session(w: RolloutWorker) -> str:
    assert w.proxy is not None
    for _ in range(600):
        if w.proxy.sessions.open_sessions:
            return next(iter(w.proxy.sessions.open_sessions))
        await asyncio.sleep(0.05)
    raise AssertionError("no session opened")


async def test_a_local_process_without_the_run_secret_cannot_touch_a_live_rollout(tmp_path: Path) -> None:
    """The in-run proxy's TCP port: listing sessions, writing a turn into a live rollout and
    closing it all need the per-run secret; a page by DNS rebinding (a foreign Host) is refused
    even with it. With the secret, a session closed from outside ends that rollout as ours
    (retried in a fresh session), and the run goes on — no KeyError, no traceback."""
    cfg = run_config(tmp_path, WAIT.format(s=4), "local")
    async with RolloutWorker(cfg, engine(OneAtATime, 0.0)) as w:
        rollout = asyncio.create_task(w.rollout(load_shipped("train")[0], session_id="live"))
        sid = await _live_session(w)
        assert w.proxy is not None and w.proxy.secret
        base, secret = w.proxy.base_url, w.proxy.secret
        body = {"model": "m", "messages": [{"role": "user", "content": "forged"}], "max_tokens": 4}
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            assert (await c.get("/legorl/sessions")).status_code == 401
            assert (await c.delete(f"/legorl/sessions/{sid}")).status_code == 401
            forged = await c.post(f"/s/{sid}/v1/chat/completions", json=body)
            assert forged.status_code == 401, forged.text
            forged = await c.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {sid}"})
            assert forged.status_code == 401, forged.text
            assert not w.proxy.sessions.open_sessions[sid].turns  # nothing was written into it
            rebinding = {"authorization": f"Bearer {secret}", "host": f"attacker.example:{w.proxy.port}"}
            refused = await c.get("/legorl/sessions", headers=rebinding)
            assert refused.status_code == 403 and "rebinding" in refused.json()["error"]["message"]
            auth = {"authorization": f"Bearer {secret}"}
            listed = (await c.get("/legorl/sessions", headers=auth)).json()["sessions"]
            assert [s["session"] for s in listed] == [sid]
            assert (await c.delete(f"/legorl/sessions/{sid}", headers=auth)).status_code == 200
        rec = await rollout
    o = rec.trajectory.outcome
    # the closed attempt was ours and retried; the retry (a fresh session) ran to its end
    assert o.evidence["retried_after"] == [f"{sid}: {SESSION_CLOSED}"], o.evidence
    assert rec.trajectory.session_id == f"{sid}-retry1" and o.status is Status.NO_PATCH


async def test_a_session_closed_from_outside_on_every_attempt_is_masked(tmp_path: Path) -> None:
    cfg = run_config(tmp_path, WAIT.format(s=3), "local")
    async with RolloutWorker(cfg, engine(OneAtATime, 0.0)) as w:
        assert w.proxy is not None
        rollout = asyncio.create_task(w.rollout(load_shipped("train")[0], session_id="twice"))
        closed: set[str] = set()
        while not rollout.done():
            for sid in list(w.proxy.sessions.open_sessions):
                if sid not in closed:
                    closed.add(sid)
                    w.proxy.app.ctx.sessions.close(sid).closed_externally = True  # what the DELETE route does
            await asyncio.sleep(0.05)
        rec = rollout.result()
    o = rec.trajectory.outcome
    assert o.status is Status.INFRA_ERROR and o.masked and o.evidence["cause"] == SESSION_CLOSED, o.evidence
    assert SESSION_CLOSED in o.flags
