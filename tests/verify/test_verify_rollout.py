"""Failure classes of a whole rollout (command harness, real local sandboxes): what the
agent causes is trained on with reward 0; what the infrastructure causes is retried and
then masked; the harness gets the proxy URL of its session."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile

import pytest

from legorl.harness.base import AgentRun
from legorl.harness.command import CommandHarness
from legorl.rollout import RolloutConfig, SandboxSocket, run_rollout
from legorl.sandbox.base import Limits
from legorl.types import Status, Task
from tests.helpers.tasks_util import added_file, backend_and_images, pick_task, rollout


def agent_caused(res) -> None:  # type: ignore[no-untyped-def]
    o = res.outcome
    assert not o.masked and not o.status.is_infra and o.reward == 0.0, (o.status, o.flags, o.evidence)


@pytest.mark.parametrize(
    "script,status,flag",
    [
        ("true", Status.NO_PATCH, None),
        ("sleep 60", Status.AGENT_TIMEOUT, None),
        ("rm -rf .git", Status.AGENT_CRASH, "no_diff"),
        # Killing every process it can see (its own harness included) is the agent's doing.
        ("echo x >> README.rst; kill -9 -1; sleep 5", Status.FAILED, None),
        # Exhausting memory (the cgroup OOM-kills it) or the disk is the agent's doing too.
        ("echo x >> README.rst; python3 -c 'b = bytearray(1 << 30)'", Status.FAILED, "resource_exhausted"),
        # A full disk even stops git from producing the diff: the agent crashed its own sandbox.
        (
            "echo x >> README.rst; dd if=/dev/zero of=/tmp/fill bs=1M count=400 2>/dev/null; true",
            Status.AGENT_CRASH,
            "resource_exhausted",
        ),
    ],
    ids=["no_patch", "timeout", "broken_git", "kill_all", "oom", "disk_full"],
)
async def test_agent_caused_outcomes(script: str, status: Status, flag: str | None) -> None:
    task = pick_task()
    async with backend_and_images("local") as (backend, images):
        res = await rollout(task, script, backend, images, limits=Limits(memory_mb=384, disk_mb=128), timeout_s=6)
    agent_caused(res)
    assert res.outcome.status is status, (res.outcome.status, res.outcome.flags, res.outcome.evidence)
    if flag:
        assert flag in res.outcome.flags, res.outcome.flags


class EngineDown:
    """A harness whose model server failed (what the proxy reports as engine_error)."""

    name = "engine-down"

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, sb, task: Task, proxy_url, repo_dir: str, timeout_s: float) -> AgentRun:  # type: ignore[no-untyped-def]
        self.calls += 1
        await sb.exec("true")
        return AgentRun(exit_code=1, status=Status.ENGINE_ERROR, details={"error": "engine unreachable"})


async def test_infrastructure_failure_in_agent_stage_is_masked() -> None:
    """One attempt here; the worker retries it in a fresh sandbox and session (test_loop_worker.py)."""
    task = pick_task()
    harness = EngineDown()
    async with backend_and_images("local") as (backend, images):
        image = await images.for_task(task)
        res = await run_rollout(task, harness, backend, image, RolloutConfig())  # type: ignore[arg-type]
    o = res.outcome
    assert harness.calls == 1 and res.attempts == 1
    assert o.status is Status.INFRA_ERROR and o.masked and o.evidence["cause"] == "engine_error"


async def test_command_harness_reaches_its_proxy_session_over_loopback() -> None:
    """OPENAI_BASE_URL/ANTHROPIC_BASE_URL point at the sandbox's forwarded port of the session socket."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n", 1)[0])
        body = json.dumps({"object": "list", "data": [{"id": "policy"}]}).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (len(body), body)
        )
        await writer.drain()
        writer.close()

    sock_dir = tempfile.mkdtemp(prefix="lg-proxy-")
    sock = os.path.join(sock_dir, "session.sock")
    server = await asyncio.start_unix_server(handle, path=sock)
    script = (
        "python3 - > PROXY.txt <<'EOF'\n"
        "import os, urllib.request\n"
        "print(os.environ['OPENAI_BASE_URL'], os.environ['ANTHROPIC_BASE_URL'])\n"
        "print(urllib.request.urlopen(os.environ['OPENAI_BASE_URL'] + '/models', timeout=10).read().decode())\n"
        "EOF\n"
    )
    task = pick_task()
    try:
        async with backend_and_images("local") as (backend, images):
            image = await images.for_task(task)
            res = await run_rollout(task, CommandHarness(script), backend, image, RolloutConfig(), SandboxSocket(sock))  # type: ignore[arg-type]
    finally:
        server.close()
        await server.wait_closed()
    out = added_file(res.diff, "PROXY.txt")
    assert out.splitlines()[0] == "http://127.0.0.1:8000/v1 http://127.0.0.1:8000", out
    assert '"id": "policy"' in out
    assert seen and seen[0].startswith(b"GET /v1/models ")
    assert res.outcome.status is Status.FAILED  # PROXY.txt is not a fix
