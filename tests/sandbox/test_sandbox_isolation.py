"""What a sandbox must not reach, and what it cannot break: run against both backends.

Every attack runs inside a real sandbox; the host side (a loopback listener, marker files,
the Docker socket, another sandbox) is real too. Resource bombs must end in an ExecResult
whose flags name the cause (agent-caused), with the host and the sandbox machinery intact.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path

import uvicorn

from legorl.sandbox import ImageRef, Limits, SandboxSpec
from legorl.sandbox.testing import HIDDEN_MARKER, DemoRepo

PY_CONNECT = (
    "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); print('CONNECTED')"
)


async def test_no_network_at_all(backend, task: ImageRef) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        async with await backend.start(SandboxSpec(image=task.key)) as sb:
            res = await sb.exec(f'python3 -c "{PY_CONNECT}" 127.0.0.1 {port}')
            assert res.exit_code != 0 and "CONNECTED" not in res.stdout  # the host's loopback is not ours
            res = await sb.exec(
                "python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/', timeout=5)\""
            )
            assert res.exit_code != 0
            res = await sb.exec("python3 -m pip download --no-cache-dir -d /tmp/x --timeout 3 --retries 0 six")
            assert res.exit_code != 0
            devs = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
            assert devs.stdout.split() == ["lo"]
    finally:
        listener.close()


async def test_no_host_files_socket_or_task_material(backend, task: ImageRef, repo: DemoRepo) -> None:
    marker = f"legorl-marker-{uuid.uuid4().hex}"
    host_files = [Path("/root") / marker, Path("/tmp") / marker]
    for p in host_files:
        p.write_text("host secret")
    try:
        async with await backend.start(SandboxSpec(image=task.key)) as sb:
            for p in host_files:
                assert (await sb.exec(f"test -e {p}")).exit_code == 1
            assert (await sb.exec("ls /work /var/lib/legorl 2>&1")).exit_code != 0
            for sock in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
                assert (await sb.exec(f"test -e {sock}")).exit_code == 1
            assert (await sb.exec(f"test -e {repo.path}")).exit_code == 1
            found = await sb.exec(
                f"grep -rl {HIDDEN_MARKER} / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head -3"
            )
            assert found.stdout == ""
            # no host process is visible, and pid 1 is ours
            procs = await sb.exec("ps -eo pid=,comm= | wc -l")
            assert int(procs.stdout) <= 6
    finally:
        for p in host_files:
            p.unlink()


async def test_no_view_of_other_sandboxes(backend, task: ImageRef) -> None:
    async with (
        await backend.start(SandboxSpec(image=task.key)) as a,
        await backend.start(SandboxSpec(image=task.key)) as b,
    ):
        await a.exec("echo mine > /tmp/a-only; sleep 300 >/dev/null 2>&1 &")
        assert (await b.exec("test -e /tmp/a-only")).exit_code == 1
        assert (await b.exec("pgrep -c sleep || true")).stdout.strip() == "0"
        assert (await b.exec("cat /repo/calc.py")).exit_code == 0


async def test_fork_bomb_is_contained(backend, task: ImageRef) -> None:
    spec = SandboxSpec(image=task.key, limits=Limits(pids=64))
    async with await backend.start(spec) as sb:
        res = await sb.exec("bomb() { bomb | bomb; }; bomb", timeout_s=8)
        assert res.pids_limited and res.resource_exhausted
        for _ in range(50):  # the tree was killed: once the kernel has freed it, the sandbox works
            after = await sb.exec("echo alive")
            if after.stdout == "alive\n":
                break
            await asyncio.sleep(0.1)
        assert after.stdout == "alive\n", after
    assert os.system("true") == 0


async def test_memory_bomb_is_contained(backend, task: ImageRef) -> None:
    spec = SandboxSpec(image=task.key, limits=Limits(memory_mb=256))
    async with await backend.start(spec) as sb:
        res = await sb.exec("python3 -c \"x = b'x' * (1200 << 20); print(len(x))\"", timeout_s=60)
        assert res.oom_killed and res.exit_code in (-9, 137) and res.stdout == ""  # sh reports 128+9
        assert (await sb.exec("echo alive")).stdout == "alive\n"


async def test_disk_filler_is_contained(backend, task: ImageRef) -> None:
    spec = SandboxSpec(image=task.key, limits=Limits(memory_mb=1024, disk_mb=128))
    async with await backend.start(spec) as sb:
        res = await sb.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=1024", timeout_s=120)
        assert res.exit_code != 0 and res.disk_full, res
        size = int((await sb.exec("stat -c %s /tmp/fill")).stdout)
        assert size <= (128 + 64) << 20  # docker's quota also counts the image: approximate
        await sb.exec("rm /tmp/fill")
        assert (await sb.exec("echo alive > /tmp/ok && cat /tmp/ok")).stdout == "alive\n"


async def test_proxy_socket_is_the_only_way_out(backend, task: ImageRef, tmp_path: Path) -> None:
    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        reply = b"hello from host " + scope["path"].encode() + b" " + body
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": reply})

    sock_path = str(tmp_path / "proxy.sock")
    server = uvicorn.Server(uvicorn.Config(app, uds=sock_path, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        spec = SandboxSpec(image=task.key, proxy_socket=sock_path, proxy_port=8123)
        async with await backend.start(spec) as sb:
            assert sb.proxy_url == "http://127.0.0.1:8123"
            script = (
                "import sys, urllib.request; "
                "r = urllib.request.urlopen(urllib.request.Request(sys.argv[1] + '/v1/echo', data=b'x' * 300000)); "
                "body = r.read(); print(body[:24].decode(), len(body))"
            )
            res = await sb.exec(f'python3 -c "{script}" {sb.proxy_url}')
            assert res.stdout == "hello from host /v1/echo 300025\n", res
            assert (await sb.exec(f"test -e {sock_path}")).exit_code == 1  # no path to the socket inside
        async with await backend.start(SandboxSpec(image=task.key, proxy_port=8123)) as sb:
            assert sb.proxy_url is None
            res = await sb.exec(f'python3 -c "{PY_CONNECT}" 127.0.0.1 8123')
            assert "CONNECTED" not in res.stdout
    finally:
        server.should_exit = True
        await serving


async def test_no_administration_from_inside(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        res = await sb.exec("mount -t tmpfs none /mnt")
        assert res.exit_code != 0 and "permission denied" in res.stderr.lower()
        assert (await sb.exec("hostname evil")).exit_code != 0
        assert (await sb.exec("echo 1 > /proc/sys/kernel/sysrq")).exit_code != 0
        caps = await sb.exec("grep CapEff /proc/self/status")
        assert int(caps.stdout.split()[1], 16) & (1 << 21) == 0  # no CAP_SYS_ADMIN
        # pid 1 (our init) cannot be inspected or killed from inside
        assert (await sb.exec("cat /proc/1/environ")).exit_code != 0
        await sb.exec("kill -9 1")
        assert (await sb.exec("echo alive")).stdout == "alive\n"


async def test_no_host_sysfs_or_host_paths_in_mount_tables(backend, task: ImageRef, tmp_path: Path) -> None:
    """/sys is a small synthetic tmpfs, not the host's sysfs (block devices, PCI, DMI, cgroup
    paths naming the container), and no mount table names a host path: not the image store
    or scratch dir behind the overlay, not the source of a read-only mount (dir or file)."""
    shared = tmp_path / f"legorl-shared-{uuid.uuid4().hex[:8]}"
    shared.mkdir()
    (shared / "tool.txt").write_text("tool\n")
    single = tmp_path / "single.txt"
    single.write_text("single\n")
    mounts = {str(shared): "/opt/shared", str(single): "/opt/one/single.txt"}
    host_paths = [str(tmp_path), str(Path.home()), "/var/lib", "/run/legorl", "/root/.cache", "/work"]
    async with await backend.start(SandboxSpec(image=task.key, readonly_mounts=mounts)) as sb:
        assert (await sb.exec("cat /opt/shared/tool.txt /opt/one/single.txt")).stdout == "tool\nsingle\n"
        assert (await sb.exec("touch /opt/shared/x || touch /opt/one/single.txt")).exit_code != 0
        fs = await sb.exec(
            "stat -f -c %T /sys; ls /sys; ls /sys/block /sys/class /sys/fs/cgroup /sys/devices/pci0000:00 2>&1"
        )
        assert fs.stdout.split()[0] == "tmpfs" and "No such file" in fs.stdout, fs.stdout
        assert (await sb.exec("touch /sys/x")).exit_code != 0
        for table in ("/proc/self/mountinfo", "/proc/self/mounts", "/proc/1/mountinfo"):
            text = (await sb.exec(f"cat {table}")).stdout
            leaks = [
                ln for ln in text.splitlines() if any(p in ln for p in host_paths) or "sysfs" in ln or "devtmpfs" in ln
            ]
            assert not leaks and text.strip(), (table, leaks)
