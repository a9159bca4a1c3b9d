"""No harness tries the network: the proxy (on the sandbox's loopback) is all it reaches.

Each harness runs one oracle rollout of a shipped task through the production path with
its command under strace (`legorl.harness.nettrace`, the harness unmodified): every
IPv4/IPv6 destination it tried — a connect, a DNS datagram, anything sent with an address
— must be the proxy's address (a DNS query to a loopback resolver counts as going out). Offline such attempts fail
(or wait for a timeout) unseen, costing
start-up time; online they would leak. To cover a new harness, add its name to `HARNESSES`.
A warm harness runs beside the sandboxes: its driver is traced on the host the same way
(`test_the_warm_openhands_driver_reaches_only_the_proxy`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from legorl.engine.registry import EngineConfig, make_engine
from legorl.harness.install import is_built, require
from legorl.harness.nettrace import _CALLS, NetTraced, attempts, foreign
from legorl.harness.openhands_warm import WarmOpenHands
from legorl.loop.worker import RolloutRecord, RolloutWorker
from legorl.models import load_tokenizer
from legorl.types import Status
from tests.helpers.harness_util import (
    Setup,
    docker_missing,
    harness_missing,
    run_config,
    shipped,
    summary,
)

pytestmark = [pytest.mark.harness, pytest.mark.slow]
HARNESSES = ["claude-code", "opencode", "openhands", "mini-swe-agent", "codex", "pi", "gemini-cli", "qwen-code"]


async def traced_rollout(setup: Setup) -> RolloutRecord:
    cfg = run_config(setup)
    engine = make_engine(EngineConfig.model_validate(cfg.engine.model_dump()), load_tokenizer(setup.model))
    try:
        async with RolloutWorker(cfg, engine) as w:
            w.harness = NetTraced(w.harness)
            return await w.rollout(shipped(1)[0])
    finally:
        await engine.close()


def _run(harness: str, backend: str) -> None:
    if why := harness_missing(harness):
        pytest.skip(why)
    if not is_built("strace"):
        pytest.skip("strace layer not built: run scripts/setup_harnesses.sh")
    rec = asyncio.run(traced_rollout(Setup(harness, backend=backend)))
    details = rec.result.agent.details
    assert rec.trajectory.outcome.status == Status.RESOLVED, summary(rec)
    assert details["net_traced"] == "1" and int(details["net_attempts"]) > 0, details  # it did reach the proxy
    assert details["net_foreign"] == "", f"{harness} tried the network: {details['net_foreign']}"


@pytest.mark.parametrize("harness", HARNESSES)
def test_only_the_proxy_is_reached(harness: str) -> None:
    _run(harness, "local")


@pytest.mark.docker
def test_only_the_proxy_is_reached_on_docker() -> None:
    if why := docker_missing():
        pytest.skip(why)
    _run("claude-code", "docker")


@dataclass
class TracedWarmOpenHands(WarmOpenHands):
    """The warm driver under strace on the host (the SDK process is the harness here)."""

    log: str = ""
    proxy_urls: list[str] = field(default_factory=list)

    def driver_command(self) -> list[str]:
        strace = f"{require('strace')}/bin/strace"
        return [
            strace,
            "-f",
            "-qq",
            "-e",
            "signal=none",
            "-e",
            f"trace={_CALLS}",
            "-o",
            self.log,
            *super().driver_command(),
        ]

    async def run(self, sb, task, proxy_url, repo_dir, timeout_s):  # noqa: ANN001, ANN201
        self.proxy_urls.append(proxy_url or "")
        return await super().run(sb, task, proxy_url, repo_dir, timeout_s)


def test_the_warm_openhands_driver_reaches_only_the_proxy(tmp_path: Path) -> None:
    if why := harness_missing("openhands-warm"):
        pytest.skip(why)
    if not is_built("strace"):
        pytest.skip("strace layer not built: run scripts/setup_harnesses.sh")
    setup = Setup("openhands-warm")
    cfg = run_config(setup)
    engine = make_engine(EngineConfig.model_validate(cfg.engine.model_dump()), load_tokenizer(setup.model))
    harness = TracedWarmOpenHands(model=cfg.proxy.served_model, log=str(tmp_path / "driver.strace"))

    async def go() -> RolloutRecord:
        w = RolloutWorker(cfg, engine)
        w.harness = harness
        try:
            async with w:
                return await w.rollout(shipped(1)[0])
        finally:
            await engine.close()

    rec = asyncio.run(go())
    assert rec.trajectory.outcome.status == Status.RESOLVED, summary(rec)
    log = "".join(p.read_text() for p in tmp_path.glob("driver.strace*"))
    url = urlsplit(harness.proxy_urls[0])
    proxy = (url.hostname or "", url.port or 80)
    assert proxy in attempts(log)  # the trace saw the model calls
    assert foreign(log, allow={proxy}) == [], "the warm OpenHands driver tried the network"


def test_foreign_destinations_are_found() -> None:
    log = (
        '7 connect(3, {sa_family=AF_INET, sin_port=htons(8000), sin_addr=inet_addr("127.0.0.1")}, 16) = 0\n'
        '8 connect(4, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("192.0.2.53")}, 16) = -1\n'
        "9 connect(5, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), "
        'inet_pton(AF_INET6, "2001:db8::1", &sin6_addr), sin6_scope_id=0}, 28) = -1 ENETUNREACH\n'
        '9 connect(6, {sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"}, 110) = -1 ENOENT\n'
    )
    assert foreign(log) == [("192.0.2.53", 53), ("2001:db8::1", 443)]
    dns = '1 connect(3, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("127.0.0.53")}, 16) = 0\n'
    assert foreign(dns) == [("127.0.0.53", 53)]  # a lookup, even through a loopback resolver
    assert foreign(log + dns, allow={("127.0.0.1", 8000)}) == [
        ("127.0.0.53", 53),
        ("192.0.2.53", 53),
        ("2001:db8::1", 443),
    ]
