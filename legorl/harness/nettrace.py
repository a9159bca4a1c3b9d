"""Which sockets a harness tried to reach: its run under strace, in its own sandbox.

Why: a harness that tries the network at start-up (a model catalogue, a cost map,
telemetry, an update check, a DNS lookup) costs seconds offline — a connect that fails
fast, or a lookup that waits for its timeout — and would leak the task online. Inside a
sandbox nothing but the proxy answers, so the attempts are invisible in the outcome; they
are visible to the kernel. `NetTraced(adapter)` runs any adapter's unchanged command under
`strace -f` (from the read-only `strace` layer, the same on both sandbox backends: ptrace
of one's own children needs no privilege) recording every `connect`/`sendto`/`sendmsg`,
and `foreign(log, allow)` lists the destinations other than the proxy's.

The harness itself is not touched: the wrapper adds one layer to mount and puts
`strace … -- /bin/sh -c '<the adapter's command>'` in front of the adapter's command.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from legorl.harness.base import AGENT_DIR, HarnessVerdict, Launch, NativeAdapter
from legorl.harness.install import require
from legorl.sandbox.base import ExecResult
from legorl.types import Task

LOG = f"{AGENT_DIR}/net.strace"
_CALLS = "connect,sendto,sendmsg,sendmmsg"
_INET = re.compile(
    r'sa_family=AF_INET6?, sin6?_port=htons\((\d+)\),.*?(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")'
)


def attempts(log: str) -> list[tuple[str, int]]:
    """Every (address, port) an IPv4/IPv6 connect or datagram was addressed to."""
    return [(m.group(2) or m.group(3), int(m.group(1))) for m in _INET.finditer(log)]


def is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("::1", "::ffff:127.0.0.1")


def foreign(log: str, allow: set[tuple[str, int]] | None = None) -> list[tuple[str, int]]:
    """The destinations tried other than `allow` (default: any loopback address but DNS's
    port 53 — a name lookup is an attempt to go out, wherever the resolver listens)."""
    if allow is not None:
        return sorted({a for a in attempts(log) if a not in allow})
    return sorted({a for a in attempts(log) if not is_loopback(a[0]) or a[1] == 53})


@dataclass
class TracedLaunch(Launch):
    proxy: tuple[str, int] = ("127.0.0.1", 8000)  # the one destination allowed: the session's proxy


@dataclass(frozen=True)
class NetTraced(NativeAdapter):
    """Any adapter, run under strace; `outputs['netlog']` is the trace."""

    inner: NativeAdapter
    calls: str = _CALLS  # what strace records (-e trace=); e.g. add `execve,openat` to see where start-up goes

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def layers(self) -> tuple[str, ...]:
        return (*self.inner.layers, "strace")

    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        launch = self.inner.launch(task, base_url, repo_dir)
        strace = f"{require('strace')}/bin/strace"
        cmd = (
            f"exec {strace} -f -tt -qq -e signal=none -e trace={self.calls} -o {LOG} -- "
            f"/bin/sh -c {shlex.quote(launch.command)}"
        )
        host, _, port = base_url.split("//", 1)[-1].split("/", 1)[0].rpartition(":")
        return TracedLaunch(
            cmd,
            launch.env,
            launch.files,
            {**launch.outputs, "netlog": LOG},
            launch.binary,
            proxy=(host.strip("[]"), int(port or 80)),
        )

    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        """The adapter's verdict, plus `net_attempts` (how many IP destinations were tried,
        the proxy included) and `net_foreign` (`addr:port,...` of the others: anything but the
        proxy's address, loopback or not) in its details;
        `net_traced` says the trace was there at all (a missing trace proves nothing)."""
        verdict = self.inner.interpret(res, outputs, launch)
        log = outputs.get("netlog", "")
        allow = {launch.proxy} if isinstance(launch, TracedLaunch) else None
        details = {
            **verdict.details,
            "net_traced": "1" if log else "0",
            "net_attempts": str(len(attempts(log))),
            "net_foreign": ",".join(f"{a}:{p}" for a, p in foreign(log, allow)),
        }
        return HarnessVerdict(verdict.status, details)
