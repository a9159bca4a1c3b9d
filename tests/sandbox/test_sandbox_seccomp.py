"""The syscall filter: what it denies (from inside real sandboxes), and that normal work still runs.

Both backends install the same filter (`legorl/sandbox/in_sandbox/seccomp.py`) in the sandbox's pid 1:
the local backend's zygote, the docker backend's init (over Docker's own profile, which lets
unshare, setns, mount, clone3 and clone(CLONE_NEW*) through for a container with
CAP_SYS_ADMIN). Every check runs against both backends; the program is also
checked off-line, for both architectures, with a small BPF interpreter, and on Python 3.7
(the oldest python3 an image may bring) where one is at hand.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import pytest

from legorl.sandbox import (
    ImageRef,
    ImageStore,
    SandboxSpec,
    docker,
    local,
    open_backend,
)
from legorl.sandbox.base import SandboxError

# The filter runs in the sandbox, so the host never imports it: the test reads it by path.
_spec = importlib.util.spec_from_file_location("seccomp", Path(local.ZYGOTE_PATH).with_name("seccomp.py"))
assert _spec is not None and _spec.loader is not None
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)

# syscall(nr, args...) from inside; prints "<ret> <errno name>"
PY_SYSCALL = (
    "import ctypes,errno,sys; l=ctypes.CDLL(None,use_errno=True); "
    "r=l.syscall(*[ctypes.c_long(int(x,0)) for x in sys.argv[1:]]); "
    "print(r, errno.errorcode.get(ctypes.get_errno(), 0) if r<0 else 0)"
)
# i386 getpid through int 0x80, from a 64-bit process
PY_INT80 = (
    "import ctypes,mmap; m=mmap.mmap(-1,4096,prot=7); m.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3'); "
    "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())"
)
# threads that start subprocesses, and a fork-based multiprocessing pool
PY_WORK = (
    "import subprocess,concurrent.futures as cf; "
    "run=lambda i: subprocess.run(['sh','-c','echo %d' % i],capture_output=True,text=True,check=True).stdout; "
    "out=list(cf.ThreadPoolExecutor(8).map(run, range(16))); "
    "import multiprocessing as mp; print(len(out), mp.get_context('fork').Pool(2).map(abs,[-1,-2]))"
)


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


async def _docker_filters(backend) -> int:  # type: ignore[no-untyped-def]
    """How many filters Docker itself gives a container: 1 with its seccomp profile on, else 0."""
    if backend.name != "docker":
        return 0
    info = (await backend._call("GET", "/info")).json()
    return int(any("name=seccomp" in o and "unconfined" not in o for o in info.get("SecurityOptions") or []))


async def test_filter(backend, task: ImageRef) -> None:
    async with await backend.start(SandboxSpec(image=task.key)) as sb:
        res = await sb.exec("grep Seccomp /proc/self/status; grep Seccomp /proc/1/status")
        mine, init = res.stdout.split()[:4], res.stdout.split()[4:]
        # Every command carries exactly pid 1's filters (it installs none of its own). Under
        # Docker, its profile comes first: ours is the second; which one denies what is
        # shown by the calls below, which Docker's profile allows with CAP_SYS_ADMIN.
        assert mine == init and mine[:3] == ["Seccomp:", "2", "Seccomp_filters:"], res.stdout
        assert int(mine[3]) == 1 + await _docker_filters(backend), res.stdout
        res = await sb.exec("grep NoNewPrivs /proc/self/status /proc/1/status")
        assert res.stdout.split()[1::2] == ["1", "1"], res.stdout  # the kernel takes a filter only then
        for flag in ("-U", "-r", "-Urm", "-n", "-p -f", "-i", "-u", "-C"):
            res = await sb.exec(f"unshare {flag} true")
            assert res.exit_code != 0 and "not permitted" in res.stderr, (flag, res)
        res = await sb.exec("unshare -Urm sh -c 'mount -t tmpfs none /mnt' && echo mounted")
        assert res.exit_code != 0 and "mounted" not in res.stdout, res
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


async def _start_is_refused(name: str, store: ImageStore, task: ImageRef) -> None:
    """The backend's start fails, naming the refused filter, when `install()` raises."""
    backend = open_backend(name, store)
    try:
        with pytest.raises(SandboxError, match=r"seccomp refused \(test\)"):
            await backend.start(SandboxSpec(image=task.key))
    finally:
        await backend.aclose()


async def test_start_fails_if_the_filter_cannot_be_installed(
    store: ImageStore, task: ImageRef, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox_dir = Path(local.ZYGOTE_PATH).parent
    for name in ("zygote.py", "init.py", "linux.py"):
        shutil.copy(sandbox_dir / name, tmp_path / name)
    (tmp_path / "seccomp.py").write_text("def install():\n    raise OSError(22, 'seccomp refused (test)')\n")
    monkeypatch.setattr(local, "ZYGOTE_PATH", str(tmp_path / "zygote.py"))
    await _start_is_refused("local", store, task)


@pytest.mark.docker
async def test_docker_start_fails_if_the_filter_cannot_be_installed(
    store: ImageStore, task: ImageRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host sends the filter's source with the init's at each start (docker.SECCOMP_SRC).
    monkeypatch.setattr(docker, "SECCOMP_SRC", b"def install():\n    raise OSError(22, 'seccomp refused (test)')\n")
    await _start_is_refused("docker", store, task)


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
    insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
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


def test_runs_on_python_37() -> None:
    # The docker backend runs the init and the filter's source under the image's python3,
    # which may be as old as 3.7: both must compile there, and build the same program.
    found = [shutil.which("python3.7"), *sorted(map(str, Path.home().glob(".pyenv/versions/3.7*/bin/python3.7")))]
    py37 = next(
        (p for p in found if p and subprocess.run([p, "-c", ""], capture_output=True, check=False).returncode == 0),
        None,
    )
    if py37 is None:
        pytest.skip("no python3.7 at hand")
    sandbox_dir = Path(S.__file__).parent
    code = (
        "import hashlib,sys; sys.path.insert(0, sys.argv[1]); import seccomp; "
        "compile(open(sys.argv[1] + '/init.py').read(), 'init.py', 'exec'); "
        "print(hashlib.sha256(seccomp.FILTER or b'').hexdigest())"
    )
    out = subprocess.run([py37, "-I", "-S", "-c", code, str(sandbox_dir)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == hashlib.sha256(S.FILTER or b"").hexdigest()
