"""The sandboxes' seccomp-BPF syscall filter: a denylist modelled on Docker's default profile.

Why: the user namespace, the dropped capabilities and no_new_privs already keep a sandbox
from administering the kernel, but every syscall the kernel reaches is attack surface, and
some need no capability at all: creating a nested user namespace (`unshare -U`, then the
mount/netfilter code is reachable as "root" of it), the keyrings (not namespaced), bpf,
userfaultfd, io_uring. Docker applies its default seccomp profile to every container; this
is the same line of defence for the `local` backend, and the docker backend installs it too,
on top of Docker's own: it creates its containers with CAP_SYS_ADMIN (for the disk quota's
tmpfs; the init drops it before any command), and Docker's profile then lets unshare, setns,
mount, clone3 and clone(CLONE_NEW*) through. With this filter, neither backend allows them.

Denied with EPERM: keyrings, bpf/perf/userfaultfd/io_uring, module and kexec loading,
accounting/swap/reboot/syslog/quota, the whole mount API, unshare and setns, open_by_handle_at,
setting the clock, iopl/ioperm, personality() except the values Docker allows, and clone()
with any CLONE_NEW* flag. clone3 gets ENOSYS (its flags sit behind a pointer seccomp cannot
read), so glibc, Node and Bun fall back to clone. A syscall of another ABI (i386 via int 0x80,
a foreign arch) kills the process, since the numbers below would not mean the same calls;
the x32 ABI (x86_64 numbers with bit 30 set) is denied. Everything else is allowed.

Standard library only, and Python >= 3.7 (annotations stay unevaluated strings, thanks to
the __future__ import): the local backend's zygote imports this file by path under
`python -I -S`, builds the program once (`FILTER`) and each sandbox's pid 1 only calls
`install()` after no_new_privs, so every command inherits the filter. The docker backend
sends this file's source into the container with the init's; the init (`init.py`,
`install_filter`) runs it as a module under the image's python3 and calls `install()`. Numbers: x86_64 from
asm/unistd_64.h, aarch64 from
asm-generic/unistd.h. Cost: ~0.15 ms per sandbox start to attach; at run time, only clone and
personality look at an argument, every other verdict depends on arch and number alone, which
lets the kernel's per-syscall action cache (5.11+) skip the program for allowed calls.
"""

from __future__ import annotations

import ctypes
import os
import struct

AUDIT_ARCH_X86_64 = 0xC000003E  # EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

# name: (x86_64, aarch64); None where the arch has no such call
DENY: dict[str, tuple[int, int | None]] = {
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "acct": (163, 89),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "syslog": (103, 116),
    "quotactl": (179, 60),
    "quotactl_fd": (443, 443),
    "nfsservctl": (180, 42),
    "lookup_dcookie": (212, 18),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "move_mount": (429, 429),
    "open_tree": (428, 428),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    "open_by_handle_at": (304, 265),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "clock_adjtime": (305, 266),
    "adjtimex": (159, 171),
    "iopl": (172, None),
    "ioperm": (173, None),
}
SYS_CLONE = (56, 220)
SYS_CLONE3 = (435, 435)
SYS_PERSONALITY = (135, 92)

CLONE_NEW_ANY = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET (NEWTIME is CSIGNAL's bit in clone)
PERSONALITY_OK = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # Docker's: PER_LINUX(32) [| UNAME26], query

EPERM, ENOSYS = 1, 38
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16  # struct seccomp_data; args[0]'s low word (little-endian)
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


def build(arch: int) -> bytes:
    """The BPF program for `arch` (an AUDIT_ARCH_* value) as packed `struct sock_filter`s.

    The syscall number goes down a binary search over the numbers with a rule (~6 tests,
    not ~50): attaching a filter makes the kernel run it for every syscall number to fill
    its action cache, so a short path is ~60 us less per sandbox start."""
    col = {AUDIT_ARCH_X86_64: 0, AUDIT_ARCH_AARCH64: 1}[arch]
    prog: list[tuple[int, int | str, int | str, int]] = []  # (code, jt, jf, k); str jumps name labels
    labels: dict[str, int] = {}

    def op(code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        prog.append((code, jt, jf, k))

    def search(rules: list[tuple[int, str]]) -> None:  # sorted (nr, label); no match -> allow
        if len(rules) <= 4:
            for nr, target in rules:
                op(JEQ_K, nr, target)
            op(RET_K, RET_ALLOW)
            return
        mid, upper = len(rules) // 2, f"ge{len(prog)}"
        op(JGE_K, rules[mid][0], upper)
        search(rules[:mid])
        labels[upper] = len(prog)
        search(rules[mid:])

    rules = [(nrs[col], "eperm") for nrs in DENY.values() if nrs[col] is not None]
    rules += [(SYS_CLONE3[col], "enosys"), (SYS_CLONE[col], "clone"), (SYS_PERSONALITY[col], "personality")]
    op(LD_W_ABS, OFF_ARCH)
    op(JEQ_K, arch, 0, "kill")
    op(LD_W_ABS, OFF_NR)
    if arch == AUDIT_ARCH_X86_64:
        op(JGE_K, X32_SYSCALL_BIT, "eperm")
    search(sorted(rules))
    labels["clone"] = len(prog)
    op(LD_W_ABS, OFF_ARG0)
    op(JSET_K, CLONE_NEW_ANY, "eperm")
    op(RET_K, RET_ALLOW)
    labels["personality"] = len(prog)
    op(LD_W_ABS, OFF_ARG0)
    for value in PERSONALITY_OK:
        op(JEQ_K, value, "allow")
    labels["eperm"] = len(prog)
    op(RET_K, RET_ERRNO | EPERM)
    labels["enosys"] = len(prog)
    op(RET_K, RET_ERRNO | ENOSYS)
    labels["kill"] = len(prog)
    op(RET_K, RET_KILL_PROCESS)
    labels["allow"] = len(prog)
    op(RET_K, RET_ALLOW)

    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        offs = [labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        assert all(0 <= o < 256 for o in offs), "BPF jump out of range"
        out += struct.pack("=HBBI", code, offs[0], offs[1], k)
    return bytes(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _host_arch() -> int | None:
    if struct.calcsize("P") != 8:
        return None
    return {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}.get(os.uname().machine)


_ARCH = _host_arch()
FILTER: bytes | None = build(_ARCH) if _ARCH is not None else None
_buf = ctypes.create_string_buffer(FILTER or b"", len(FILTER or b""))
_fprog = _SockFprog(len(FILTER or b"") // 8, ctypes.cast(_buf, ctypes.c_void_p))
_libc = ctypes.CDLL(None, use_errno=True)


def install() -> None:
    """Install FILTER on the calling thread (needs no_new_privs); raises OSError if it cannot."""
    if FILTER is None:
        raise OSError(95, f"no seccomp filter for machine {os.uname().machine!r} ({struct.calcsize('P') * 8}-bit)")
    ret = _libc.prctl(
        ctypes.c_int(PR_SET_SECCOMP),
        ctypes.c_ulong(SECCOMP_MODE_FILTER),
        ctypes.byref(_fprog),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
