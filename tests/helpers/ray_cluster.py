"""A real multi-node Ray cluster on one machine, every server on 127.0.0.1: `ray start` for a
head and for each further node, each its own process group with its own ports, so a test
can kill one node (its raylet and workers) while the others keep running.

Ray turns a loopback `--node-ip-address` into the machine's routable address (and then binds
its servers on every interface) unless it runs in its single-machine mode, which refuses to
add nodes. The head runs in that mode; a further node is the same `ray start` with the one
function that rewrites the address (`services.resolve_ip_for_localhost`) left as the identity,
so its raylet, object manager and agents bind 127.0.0.1 like the head's (Ray binds loopback
whenever the node address is loopback). `ray stop` is never used: it stops every Ray
process of the machine, not only this cluster's.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

# `ray start` with the loopback node address kept as given (see the module docstring)
_LOOPBACK_START = (
    "import sys, ray._private.services as s; s.resolve_ip_for_localhost = lambda h: h; "
    "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"
)


WORKER_PORTS = 40  # per node: one per Ray worker process it may start


class PortBlock:
    """Consecutive ports below the ephemeral range (so no outgoing connection takes one
    meanwhile), all free when the block was chosen; handed out in order. Random picks per
    port collided with other nodes' worker-port ranges."""

    def __init__(self, n: int, lo: int = 20000, hi: int = 32000) -> None:
        rng = random.Random()
        for _ in range(200):
            base = rng.randrange(lo, hi - n)
            if all(_free(p) for p in range(base, base + n)):
                self.next, self.end = base, base + n
                return
        raise RuntimeError(f"no {n} consecutive free ports in {lo}..{hi}")

    def take(self, n: int = 1) -> int:
        """The first of `n` consecutive ports."""
        if self.next + n > self.end:
            raise RuntimeError("port block exhausted")
        self.next += n
        return self.next - n


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class RayNode:
    proc: subprocess.Popen[bytes]
    log: Path
    resources: dict[str, float]

    def kill(self) -> None:
        """SIGKILL the whole node at once: its process group (`ray start`, raylet, object store,
        agents) and every descendant — the raylet puts each worker in a group of its own."""
        doomed = descendants(self.proc.pid)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)

    def runs(self, pid: int) -> bool:
        """Whether process `pid` belongs to this node."""
        return pid in descendants(self.proc.pid)


def descendants(root: int) -> set[int]:
    """Every live process below `root` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # exited meanwhile
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


@dataclass
class LocalCluster:
    address: str
    temp_dir: Path
    nodes: list[RayNode] = field(default_factory=list)


def _node_args(ports: PortBlock, temp_dir: Path, num_cpus: float, resources: dict[str, float]) -> list[str]:
    nm, om, agent, agent_grpc, env_agent, metrics = (ports.take() for _ in range(6))
    wmin = ports.take(WORKER_PORTS)
    return [
        f"--num-cpus={num_cpus}",
        f"--resources={json.dumps(resources)}",
        "--node-ip-address=127.0.0.1",
        f"--node-manager-port={nm}",
        f"--object-manager-port={om}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={env_agent}",
        f"--metrics-export-port={metrics}",
        f"--min-worker-port={wmin}",
        f"--max-worker-port={wmin + WORKER_PORTS - 1}",
        "--disable-usage-stats",
        "--block",
        f"--temp-dir={temp_dir}",
        "--object-store-memory=80000000",
    ]


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", _LOOPBACK_START, "start", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def wait_started(node: RayNode, timeout: float = 180.0) -> None:
    """Until `ray start --block` says the node joined (it prints that once the raylet registered)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = node.log.read_text(errors="replace")
        if "Ray runtime started" in text:
            return
        if node.proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {node.proc.returncode}: {text[-2000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"ray start did not finish in {timeout:.0f}s: {node.log}")


_TOKEN = secrets.token_hex(32)  # this process's clusters' own auth token (never ~/.ray/auth_token)


def ray_env(**extra: str) -> dict[str, str]:
    """The environment of every process of the cluster and of its drivers: no usage stats, and
    Ray's token authentication with a token of our own (a node or driver without it is refused)."""
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _TOKEN, **extra}


def start_cluster(
    stack: ExitStack,
    head: dict[str, float],
    workers: list[dict[str, float]],
    *,
    head_cpus: float = 1,
    worker_cpus: float = 2,
) -> LocalCluster:
    """A head with `head` custom resources and one node per entry of `workers`; all nodes are
    killed when `stack` closes. The temp dir is short: Ray's unix sockets live under it."""
    temp_dir = Path(tempfile.mkdtemp(prefix="lr-ray-", dir="/tmp"))
    stack.callback(shutil.rmtree, temp_dir, ignore_errors=True)  # after the nodes are gone
    ports = PortBlock(2 + (1 + 2 * len(workers)) * (6 + WORKER_PORTS))  # a retried node takes fresh ports
    gcs = ports.take()
    address = f"127.0.0.1:{gcs}"
    cluster = LocalCluster(address, temp_dir)

    def stop() -> None:
        for node in reversed(cluster.nodes):
            node.kill()

    stack.callback(stop)
    env = ray_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")  # the head: single-machine mode, loopback
    log = temp_dir / "head.log"
    args = [
        "--head",
        f"--port={gcs}",
        f"--ray-client-server-port={ports.take()}",
        "--include-dashboard=false",
        *_node_args(ports, temp_dir, head_cpus, head),
    ]
    cluster.nodes.append(RayNode(_start(args, log, env), log, head))
    wait_started(cluster.nodes[0])
    for i, res in enumerate(workers):
        # One node at a time, and a node whose raylet missed Ray's fixed 30 s registration
        # window (a busy machine: `ray start` exits 1, "timed out during startup") is started
        # once more on fresh ports: the cluster under test, not the machine's load, is the subject.
        for attempt in range(2):
            log = temp_dir / f"node{i + 1}-{attempt}.log"
            node_dir = temp_dir / f"n{i + 1}-{attempt}"  # its own: nodes in one dir share socket names
            node_dir.mkdir()
            args = [f"--address={address}", *_node_args(ports, node_dir, worker_cpus, res)]
            node = RayNode(_start(args, log, ray_env()), log, res)
            cluster.nodes.append(node)
            try:
                wait_started(node)
                break
            except RuntimeError as e:
                if attempt or "timed out during startup" not in str(e):
                    raise
                node.kill()
                cluster.nodes.remove(node)
    return cluster
