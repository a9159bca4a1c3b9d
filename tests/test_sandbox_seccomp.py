"""The syscall filter: what it denies (from inside real sandboxes), and that normal work still runs.

What Docker's default profile also denies in the docker backend's containers runs against
both backends; the rest is the local backend's own filter (`legorl/sandbox/_seccomp.py`),
whose program is also checked off-line, for both architectures, with a small BPF interpreter.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import struct
from pathlib import Path

import pytest

from legorl.sandbox import ImageRef, ImageStore, SandboxSpec, local, make_backend
from legorl.sandbox import _seccomp as S
from legorl.sandbox.base import SandboxError
from legorl.sandbox.testing import DemoRepo, demo_repo

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]
# syscall(nr, args...) from inside; prints "<ret> <errno name>"
PY_SYSCALL = ("import ctypes,errno,sys; l=ctypes.CDLL(None,use_errno=True); "
              "r=l.syscall(*[ctypes.c_long(int(x,0)) for x in sys.argv[1:]]); "
              "print(r, errno.errorcode.get(ctypes.get_errno(), 0) if r<0 else 0)")
# i386 getpid through int 0x80, from a 64-bit process
PY_INT80 = ("import ctypes,mmap; m=mmap.mmap(-1,4096,prot=7); m.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3'); "
            "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())")
# threads that start subprocesses, and a fork-based multiprocessing pool
PY_WORK = ("import subprocess,concurrent.futures as cf; "
           "run=lambda i: subprocess.run(['sh','-c','echo %d' % i],capture_output=True,text=True,check=True).stdout; "
           "out=list(cf.ThreadPoolExecutor(8).map(run, range(16))); "
           "import multiprocessing as mp; print(len(out), mp.get_context('fork').Pool(2).map(abs,[-1,-2]))")


@pytest.fixture(scope="session")
def store() -> ImageStore:
    return ImageStore()


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> DemoRepo:
    return demo_repo(tmp_path_factory.mktemp("demo") / "repo")


@pytest.fixture(scope="session")
def task(store: ImageStore, repo: DemoRepo) -> ImageRef:
    async def build() -> ImageRef:
        return await store.ensure_task(await store.ensure_base(), repo.path, repo.base, hide_paths=list(repo.hidden))

    return asyncio.run(build())


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, store: ImageStore):  # type: ignore[no-untyped-def]
    b = make_backend(request.param, store)
    yield b
    await b.aclose()


async def _syscall(sb, *args: int) -> str:  # type: ignore[no-untyped-def]
    res = await sb.exec(f"python3 -c '{PY_SYSCALL}' " + " ".join(hex(a) for a in args))
    assert res.exit_code == 0, res.stderr
    return res.stdout.strip()


async def test_denied_under_both_backends(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        assert await _syscall(sb, 250, 0) == "-1 EPERM"  # keyctl(KEYCTL_GET_KEYRING_ID)
        assert await _syscall(sb, 248, 0, 0, 0, 0, 0) == "-1 EPERM"  # add_key
        assert await _syscall(sb, 135, 0x0040000) == "-1 EPERM"  # personality(ADDR_NO_RANDOMIZE)
        assert await _syscall(sb, 135, 0xFFFFFFFF) == "0 0"  # personality query stays allowed
        res = await sb.exec("unshare -m true")
        assert res.exit_code != 0 and "not permitted" in res.stderr
        res = await sb.exec("date -s 2020-01-01")
        assert res.exit_code != 0 and "not permitted" in res.stderr


async def test_local_filter(store: ImageStore, task: ImageRef) -> None:
    # Not run against docker: its containers are created with CAP_SYS_ADMIN (for the disk
    # quota's tmpfs, dropped by the init), which makes Docker's profile allow unshare,
    # clone(CLONE_NEW*), setns, mount and clone3, so `unshare -Urm` works there.
    backend = make_backend("local", store)
    try:
        async with await backend.start(SandboxSpec(image=task.key)) as sb:
            status = (await sb.exec("grep Seccomp /proc/self/status; grep Seccomp /proc/1/status")).stdout.split()
            assert status == ["Seccomp:", "2", "Seccomp_filters:", "1"] * 2  # pid 1 and every command
            for flag in ("-U", "-r", "-Urm", "-n", "-p -f", "-i", "-u", "-C"):
                res = await sb.exec(f"unshare {flag} true")
                assert res.exit_code != 0 and "not permitted" in res.stderr, (flag, res)
            assert await _syscall(sb, 308, 0, 0) == "-1 EPERM"  # setns
            assert await _syscall(sb, 435, 0, 0) == "-1 ENOSYS"  # clone3: libcs fall back to clone
            for flag in (0x10000000, 0x00020000, 0x20000000, 0x40000000):  # NEWUSER NEWNS NEWPID NEWNET
                assert await _syscall(sb, 56, flag | signal.SIGCHLD, 0, 0, 0, 0) == "-1 EPERM", hex(flag)
            for nr in (321, 323, 425, 165, 166, 272, 304, 175, 313, 246, 169, 163):
                # bpf userfaultfd io_uring_setup mount umount2 unshare open_by_handle_at
                # init_module finit_module kexec_load reboot acct
                assert await _syscall(sb, nr, 0, 0, 0, 0, 0) == "-1 EPERM", nr
            assert await _syscall(sb, 0x40000000 | 39) == "-1 EPERM"  # x32 getpid
            assert (await _syscall(sb, 39)).split()[1] == "0"  # plain getpid
            res = await sb.exec(f'ulimit -c 0; python3 -c "{PY_INT80}"')  # another ABI: the process is killed
            assert res.exit_code in (128 + signal.SIGSYS, -signal.SIGSYS), res
    finally:
        await backend.aclose()


async def test_start_fails_if_the_filter_cannot_be_installed(store: ImageStore, task: ImageRef, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox_dir = Path(local.ZYGOTE_PATH).parent
    for name in ("_zygote.py", "_init.py", "_linux.py"):
        shutil.copy(sandbox_dir / name, tmp_path / name)
    (tmp_path / "_seccomp.py").write_text("def install():\n    raise OSError(22, 'seccomp refused (test)')\n")
    monkeypatch.setattr(local, "ZYGOTE_PATH", str(tmp_path / "_zygote.py"))
    backend = make_backend("local", store)
    try:
        with pytest.raises(SandboxError, match=r"seccomp refused \(test\)"):
            await backend.start(SandboxSpec(image=task.key))
    finally:
        await backend.aclose()


async def test_normal_work_still_runs(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        res = await sb.exec(f'python3 -c "{PY_WORK}"')
        assert res.exit_code == 0 and res.stdout.strip() == "16 [1, 2]", res
        res = await sb.exec("git status --porcelain && git log --oneline | wc -l", cwd="/repo")
        assert res.exit_code == 0 and res.stdout == "1\n", res  # clean tree, one commit
        tiny = b"import threading\n\ndef test_it():\n    t = threading.Thread(target=print)\n    t.start(); t.join()\n"
        await sb.write_file("/tmp/t/test_tiny.py", tiny)
        res = await sb.exec("python3 -m pytest -q -p no:cacheprovider /tmp/t/test_tiny.py")
        assert res.exit_code == 0 and "1 passed" in res.stdout, res
        res = await sb.exec("sleep 5 & (timeout 1 sh -c 'sleep 3 | cat'; echo rc=$?); kill %1")
        assert "rc=124" in res.stdout, res


# --- the program itself, off-line --------------------------------------------------------


def _run_bpf(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate the subset of classic BPF the filter uses on one struct seccomp_data."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    insns = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == S.LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == S.RET_K:
            return k
        elif code in (S.JEQ_K, S.JGE_K, S.JSET_K):
            hit = acc == k if code == S.JEQ_K else acc >= k if code == S.JGE_K else bool(acc & k)
            pc += jt if hit else jf
        else:
            raise AssertionError(f"unexpected BPF op {code:#x}")
        pc += 1


@pytest.mark.parametrize("arch", [S.AUDIT_ARCH_X86_64, S.AUDIT_ARCH_AARCH64])
def test_program_decisions(arch: int) -> None:
    prog = S.build(arch)
    col = 0 if arch == S.AUDIT_ARCH_X86_64 else 1
    eperm, enosys = S.RET_ERRNO | S.EPERM, S.RET_ERRNO | S.ENOSYS
    assert len(prog) // 8 < 100
    for name, nrs in S.DENY.items():
        if nrs[col] is not None:
            assert _run_bpf(prog, nrs[col], arch) == eperm, name
    assert _run_bpf(prog, S.SYS_CLONE3[col], arch) == enosys
    assert _run_bpf(prog, S.SYS_CLONE[col], arch, (0x01200011,)) == S.RET_ALLOW  # fork()'s flags
    assert _run_bpf(prog, S.SYS_CLONE[col], arch, (0x003D0F00,)) == S.RET_ALLOW  # pthread_create's
    assert _run_bpf(prog, S.SYS_CLONE[col], arch, (0x20000000 | 17,)) == eperm  # CLONE_NEWPID
    assert _run_bpf(prog, S.SYS_CLONE[col], arch, (0xFFFFFFFF_00000011,)) == S.RET_ALLOW  # only the low word counts
    assert _run_bpf(prog, S.SYS_PERSONALITY[col], arch, (0x20008,)) == S.RET_ALLOW
    assert _run_bpf(prog, S.SYS_PERSONALITY[col], arch, (0x0040000,)) == eperm
    denied = {nrs[col] for nrs in S.DENY.values()}
    for nr in range(600):  # every number, through the binary search (args 0: clone(0), personality(0) pass)
        want = eperm if nr in denied else enosys if nr == S.SYS_CLONE3[col] else S.RET_ALLOW
        assert _run_bpf(prog, nr, arch) == want, nr
    assert _run_bpf(prog, 39, S.AUDIT_ARCH_X86_64 ^ S.AUDIT_ARCH_AARCH64 ^ arch) == S.RET_KILL_PROCESS
    assert _run_bpf(prog, 20, 0x40000003) == S.RET_KILL_PROCESS  # AUDIT_ARCH_I386
    if arch == S.AUDIT_ARCH_X86_64:
        assert _run_bpf(prog, S.X32_SYSCALL_BIT | 250, arch) == eperm
        assert _run_bpf(prog, S.X32_SYSCALL_BIT | 1, arch) == eperm
