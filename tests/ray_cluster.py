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

import json
import os
import secrets
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
_LOOPBACK_START = ("import sys, ray._private.services as s; s.resolve_ip_for_localhost = lambda h: h; "
                   "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()")  # fmt: skip


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class RayNode:
    proc: subprocess.Popen[bytes]
    log: Path
    resources: dict[str, float]

    def kill(self) -> None:
        """SIGKILL the node's whole process group: raylet, object store, agents, its workers."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


@dataclass
class LocalCluster:
    address: str
    temp_dir: Path
    nodes: list[RayNode] = field(default_factory=list)


def _node_args(temp_dir: Path, num_cpus: float, resources: dict[str, float]) -> list[str]:
    nm, om, agent, agent_grpc, env_agent, metrics, wmin = free_ports(7)
    return [f"--num-cpus={num_cpus}", f"--resources={json.dumps(resources)}", "--node-ip-address=127.0.0.1",
            f"--node-manager-port={nm}", f"--object-manager-port={om}", f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={env_agent}",
            f"--metrics-export-port={metrics}", f"--min-worker-port={wmin}", f"--max-worker-port={wmin + 40}",
            "--disable-usage-stats", "--block", f"--temp-dir={temp_dir}", "--object-store-memory=80000000"]  # fmt: skip


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-c", _LOOPBACK_START, "start", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip


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


def start_cluster(stack: ExitStack, head: dict[str, float], workers: list[dict[str, float]], *,
                  head_cpus: float = 1, worker_cpus: float = 2) -> LocalCluster:  # fmt: skip
    """A head with `head` custom resources and one node per entry of `workers`; all nodes are
    killed when `stack` closes. The temp dir is short: Ray's unix sockets live under it."""
    temp_dir = Path(tempfile.mkdtemp(prefix="lr-ray-", dir="/tmp"))
    (gcs,) = free_ports(1)
    address = f"127.0.0.1:{gcs}"
    cluster = LocalCluster(address, temp_dir)

    def stop() -> None:
        for node in reversed(cluster.nodes):
            node.kill()

    stack.callback(stop)
    env = ray_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")  # the head: single-machine mode, loopback
    log = temp_dir / "head.log"
    args = ["--head", f"--port={gcs}", f"--ray-client-server-port={free_ports(1)[0]}", "--include-dashboard=false",
            *_node_args(temp_dir, head_cpus, head)]  # fmt: skip
    cluster.nodes.append(RayNode(_start(args, log, env), log, head))
    wait_started(cluster.nodes[0])
    for i, res in enumerate(workers):
        log = temp_dir / f"node{i + 1}.log"
        args = [f"--address={address}", *_node_args(temp_dir, worker_cpus, res)]
        cluster.nodes.append(RayNode(_start(args, log, ray_env()), log, res))
    for node in cluster.nodes[1:]:
        wait_started(node)
    return cluster
