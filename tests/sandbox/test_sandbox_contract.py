"""The Sandbox contract, run against both backends (local namespaces and real Docker).

Needs root and, for the docker half, the engine scripts/setup_sandbox.sh starts; the base
image is built once per machine by that script (a test run that finds none builds it).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from legorl.sandbox import (
    DiffError,
    ImageRef,
    Limits,
    SandboxError,
    SandboxSpec,
)
from legorl.sandbox.testing import FUTURE_MARKER, HIDDEN_MARKER, DemoRepo
from tests.helpers.backends import BACKENDS


async def test_exec_output_exit_code_cwd_env(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key, env={"FROM_SPEC": "a"})) as sb:
        res = await sb.exec("echo out; echo err >&2; pwd; echo $FROM_SPEC$FROM_CALL; exit 3", env={"FROM_CALL": "b"})
        assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n/repo\nab\n", "err\n")
        assert not (res.timed_out or res.truncated or res.resource_exhausted)
        res = await sb.exec("pwd", cwd="/tmp")
        assert res.stdout == "/tmp\n"
        res = await sb.exec("kill -TERM $$")
        assert res.exit_code == -15
        res = await sb.exec("true", cwd="/does/not/exist")
        assert res.exit_code == 127 and "/does/not/exist" in res.stderr


async def test_timeout_kills_whole_tree(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        res = await sb.exec("sleep 300 & (setsid sh -c 'sleep 301 & sleep 302' &) ; sleep 303", timeout_s=1.0)
        assert res.timed_out and res.exit_code == 124
        assert res.duration_s < 15
        left = await sb.exec("ps -eo comm= | grep -c '^sleep' || true")
        assert left.stdout.strip() == "0"


async def test_background_process_outlives_its_exec(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        res = await sb.exec("nohup sleep 60 >/dev/null 2>&1 & echo started", timeout_s=10)
        assert res.exit_code == 0 and res.stdout == "started\n" and res.duration_s < 30  # not the 60 s of sleep
        assert (await sb.exec("pgrep -c sleep")).stdout.strip() == "1"


async def test_output_limit_truncates(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key, limits=Limits(output_bytes=10_000))) as sb:
        res = await sb.exec("head -c 3000000 /dev/zero | tr '\\0' a; echo done >&2")
        assert res.truncated and len(res.stdout) == 10_000 and res.stderr == "done\n"
        res = await sb.exec("head -c 200000 /dev/zero", output_limit=300_000)
        assert not res.truncated and len(res.stdout) == 200_000


async def test_cancelled_exec_is_killed(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sb.exec("sleep 120", timeout_s=300), 0.5)
        for _ in range(50):
            if (await sb.exec("pgrep -c sleep || true")).stdout.strip() == "0":
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the cancelled command is still running")


async def test_concurrent_execs(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        results = await asyncio.gather(*(sb.exec(f"sleep 0.3; echo {i}") for i in range(6)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]


async def test_files(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        blob = bytes(range(256)) * 1000
        await sb.write_file("/tmp/new/dir/blob.bin", blob, mode=0o600)
        assert await sb.read_file("/tmp/new/dir/blob.bin") == blob
        assert (await sb.exec("stat -c %a /tmp/new/dir/blob.bin")).stdout == "600\n"
        await sb.write_file("relative.txt", b"in workdir")
        assert (await sb.exec("cat /repo/relative.txt")).stdout == "in workdir"
        with pytest.raises(FileNotFoundError):
            await sb.read_file("/no/such/file")
        with pytest.raises(IsADirectoryError):
            await sb.read_file("/tmp")


async def test_repository_is_time_safe(backend, task: ImageRef, repo: DemoRepo) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        res = await sb.exec(
            "git rev-list --all | wc -l; git tag | wc -l; git remote | wc -l; "
            "git for-each-ref --format='%(refname)'; ls .git/logs 2>&1 | head -1; git status --porcelain | wc -l"
        )
        lines = res.stdout.split("\n")
        assert lines[:3] == ["1", "0", "0"], res.stdout
        assert lines[3] == "refs/heads/main"
        assert "No such file" in lines[4]
        assert lines[5] == "0"  # a clean checkout
        for rev in (repo.future, repo.past):
            assert (await sb.exec(f"git cat-file -e {rev}")).exit_code != 0
        grep = await sb.exec(f"git log --all -p | grep -c -e {FUTURE_MARKER} -e {HIDDEN_MARKER} || true")
        assert grep.stdout.strip() == "0"
        assert (await sb.exec("test -e tests/test_hidden.py")).exit_code == 1
        assert (await sb.exec("test -e tests/test_calc.py")).exit_code == 0


async def test_diff_against_upstream_base_commit(backend, task: ImageRef, repo: DemoRepo) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        await sb.exec(
            "sed -i 's/a - b  # bug/a + b/' calc.py && echo new > new_file.txt && rm README.md "
            "&& echo x > debug.log && git add new_file.txt"
        )
        patch = await sb.diff(repo.base)
        assert "+    return a + b" in patch and "+new" in patch and "deleted file mode" in patch
        assert "debug.log" not in patch  # ignored files are not the agent's change
        staged = await sb.exec("git diff --cached --name-only")
        assert staged.stdout == "new_file.txt\n"  # the agent's index is untouched
        # a commit by the agent is still part of its diff
        await sb.exec("git add -A && git commit -qm agent")
        assert await sb.diff(repo.base) == patch
        await sb.exec("rm -rf .git")
        with pytest.raises(DiffError):
            await sb.diff(repo.base)


async def test_close_cleans_up_and_is_final(backend, task: ImageRef) -> None:
    sb = await backend.start(SandboxSpec(image=task.key))
    await sb.exec("sleep 600 >/dev/null 2>&1 &")
    netns = sb.netns_path
    await sb.close()
    await sb.close()  # idempotent
    with pytest.raises(SandboxError):
        await sb.exec("true")
    for _ in range(100):  # pid 1 of the sandbox is gone (docker reaps asynchronously)
        if not os.path.exists(netns):
            break
        await asyncio.sleep(0.05)
    assert not os.path.exists(netns)


async def test_start_errors_are_sandbox_errors(backend, task: ImageRef) -> None:
    with pytest.raises(SandboxError, match="not in the cache"):
        await backend.start(SandboxSpec(image="0" * 32))
    with pytest.raises(SandboxError, match="does not exist"):
        await backend.start(SandboxSpec(image=task.key, readonly_mounts={"/no/such/dir": "/opt/x"}))


async def test_readonly_mount(backend, task: ImageRef, tmp_path: Path) -> None:
    (tmp_path / "tool.sh").write_text("echo from-host-layer\n")
    spec = SandboxSpec(image=task.key, readonly_mounts={str(tmp_path): "/opt/harness"})
    async with await backend.start(spec) as sb:
        assert (await sb.exec("sh /opt/harness/tool.sh")).stdout == "from-host-layer\n"
        res = await sb.exec("touch /opt/harness/x")
        assert res.exit_code != 0 and "Read-only file system" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tool.sh"]


CRASHER = """
import asyncio, sys
from legorl.sandbox import ImageStore, SandboxSpec, open_backend
async def main():
    b = open_backend(sys.argv[1], ImageStore())
    sb = await b.start(SandboxSpec(image=sys.argv[2]))
    await sb.exec("sleep 1000 >/dev/null 2>&1 &")
    print(sb.netns_path, flush=True)
    await asyncio.sleep(1000)
asyncio.run(main())
"""


@pytest.mark.parametrize("name", BACKENDS)
async def test_sandbox_dies_with_a_crashed_host_process(name: str, task: ImageRef) -> None:
    import signal
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHER, name, task.key, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    netns = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
    assert netns.startswith("/proc/") and os.path.exists(netns)
    proc.send_signal(signal.SIGKILL)  # no cleanup code of ours runs
    await proc.wait()
    for _ in range(300):
        if not os.path.exists(netns):
            break
        await asyncio.sleep(0.1)
    assert not os.path.exists(netns), "the sandbox outlived the process that started it"
