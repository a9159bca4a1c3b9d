"""Thin ctypes wrappers for the Linux calls the sandboxes need and Python 3.11 lacks.

Standard library only: the zygote (`zygote.py`) imports this file by path with `python -I -S`
so that forking a sandbox costs a fork, not an interpreter start. Every wrapper raises
`OSError` with the errno and the call's arguments, so a failed mount says which one.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

SYS_PIVOT_ROOT = 155
SYS_SETNS = 308

CAP_LAST_CAP = 40  # kernels report more through /proc/sys/kernel/cap_last_cap

# Docker's default capability set: what a process that believes it is root on a normal
# machine needs (chown, setuid for su, binding low ports…) and nothing that administers
# the kernel (sys_admin, sys_module, sys_ptrace, net_admin…).
KEEP_CAPS = frozenset({0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31})
# chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service net_raw
# sys_chroot mknod audit_write setfcap


def _check(ret: int, what: str) -> int:
    if ret == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.syscall(SYS_SETNS, ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns({nstype:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    ret = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount({source!r} on {target!r}, type {fstype!r}, flags {flags:#x}, {data!r})")


def umount2(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount2({target!r})")


def pivot_root(new_root: str, put_old: str) -> None:
    ret = _libc.syscall(SYS_PIVOT_ROOT, new_root.encode(), put_old.encode())
    _check(ret, f"pivot_root({new_root!r}, {put_old!r})")


def prctl(option: int, arg2: int = 0) -> int:
    ret = _libc.prctl(
        ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)
    )
    return _check(ret, f"prctl({option}, {arg2})")


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, ctypes.c_size_t(len(raw))), "sethostname")


def drop_capabilities(keep: frozenset[int] = KEEP_CAPS) -> None:
    """Drop every capability outside `keep` from the bounding set, so no program the
    sandbox executes can ever hold it (not even a set-uid one)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except OSError:
        last = CAP_LAST_CAP
    for cap in range(last + 1):
        if cap not in keep:
            prctl(PR_CAPBSET_DROP, cap)


def loopback_up() -> None:
    """Bring up `lo` in the current network namespace (a new one starts with it down)."""
    siocgifflags, siocsifflags = 0x8913, 0x8914
    iff_up = 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s.fileno(), siocgifflags, req))[1]
        fcntl.ioctl(s.fileno(), siocsifflags, struct.pack("16sh14x", b"lo", flags | iff_up))
