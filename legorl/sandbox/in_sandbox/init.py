"""The process that lives inside every sandbox as pid 1 and runs commands for the host.

Why a resident init rather than one `docker exec`/`nsenter` per command: starting a process
inside an existing sandbox then costs one fork, not a runtime round-trip, and the init can
kill a command's *whole* tree on a timeout, which neither `docker exec` nor a plain
subprocess can. Both backends run this same file: the local backend forks it from the
zygote (already in the sandbox's namespaces), the docker backend runs it as the container's
command with the image's own python3 (`python3 -I -S -c <this file>`), talking over the
attached stdin/stdout. It therefore uses the standard library only and must run on any
Python >= 3.7.

Under Docker, the host sends this file's source and then `seccomp.py`'s down stdin, each as
10 ASCII digits of length and the bytes (docker.py's BOOT reads the first and runs it; the
`__main__` block below reads the second). The init moves into its private root, drops
CAP_SYS_ADMIN, sets no_new_privs and installs that filter (`install_filter`) before it says
"ready", so no command ever runs unfiltered: if any step fails, the host gets {op: "error"}
and the start fails. The local backend's zygote installs the same filter itself.

Wire format, both directions: an 8-byte header `>II` (json length, payload length), a JSON
object, then the payload bytes. Requests carry an `id` that the reply echoes.

  exec  {cmd, cwd, env, timeout, limit}  -> {exit, timed_out, truncated, duration, out_len,
                                             disk_free}; payload = stdout + stderr
  read  {path, limit}                    -> payload = the file's bytes
  write {path, mode} + payload           -> {}
  kill  {target}                         -> {} (ends exec `target`'s tree; it reports timed_out)
  ping  {}                               -> {}
  close {}                               -> exits; the kernel then kills every process left
A failed request answers {ok: false, error, errno}. At start the init sends {op: "ready"}.

Each command runs under a *shepherd*: a forked child that is a child-subreaper, so every
process the command starts (even one that double-forks and calls setsid) stays its
descendant. On timeout the shepherd SIGKILLs all its descendants until none is left, then
reports exit code 124. When the command itself exits, its background children live on; the
exec returns with the output read so far (redirect a daemon's output to a file).

Where this runs (the rule for every `in_sandbox/` folder of the project): everything in this
folder runs inside a sandbox, in an interpreter of its own, never in the host's. The host
reads these files by path (`docker.py` sends this one and `seccomp.py` down stdin,
`local.py` starts `zygote.py`, which imports its neighbours from this folder), never imports
them, and they never import `legorl`: standard library only, Python >= 3.7. A program that
runs in a harness's own interpreter instead lives in an `in_driver/` folder.
"""

import gc
import json
import os
import select
import signal
import struct
import sys
import time

HDR = struct.Struct(">II")
MAX_JSON = 1 << 20
PR_SET_CHILD_SUBREAPER = 36
_DEFAULT_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGALRM,
    signal.SIGTERM,
    signal.SIGCHLD,
    signal.SIGINT,
    signal.SIGHUP,
)


class _Stop(Exception):
    """Raised in a shepherd by SIGALRM (timeout) or SIGTERM (the host cancelled the exec)."""


def _stop(signum, frame):
    raise _Stop()


try:
    import ctypes

    _prctl = ctypes.CDLL(None).prctl
except Exception:  # no ctypes in the image: a double-forked daemon may escape a timeout kill
    _prctl = None  # type: ignore[assignment]


def _prctl_subreaper():
    if _prctl is not None:
        _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _descendants(root):
    """Pids of every live descendant of `root`, from /proc (the sandbox's own pid space)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                data = f.read()
        except OSError:
            continue
        ppid = int(data[data.rfind(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, stack = [], [root]
    while stack:
        for c in children.get(stack.pop(), ()):
            out.append(c)
            stack.append(c)
    return out


def _kill_tree(me):
    for _ in range(200):
        kids = _descendants(me)
        if not kids:
            return
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap_all()


def _reap_all():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _shepherd(req, out_w, err_w, st_w):
    """Run one command (never returns). Reports {exit, timed_out} on `st_w`."""
    _prctl_subreaper()
    signal.signal(signal.SIGALRM, _stop)
    signal.signal(signal.SIGTERM, _stop)
    gc.disable()  # a collection would touch (and copy) every page shared with pid 1
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")  # inherited by the command: the OOM killer takes it, never pid 1
    except OSError:
        pass
    try:
        os.chdir(req["cwd"])
    except OSError as e:
        os.write(err_w, ("sandbox: cannot run command in %s: %s\n" % (req["cwd"], e.strerror)).encode())
        os.write(st_w, json.dumps({"exit": 127, "timed_out": False}).encode())
        os._exit(0)
    devnull = os.open("/dev/null", os.O_RDONLY)
    # posix_spawn (vfork + exec) rather than fork: no copy of this Python process's pages.
    # Every other fd of ours is close-on-exec (PEP 446), so the command gets 0-2 only.
    try:
        pid = os.posix_spawn(
            "/bin/sh",
            ["/bin/sh", "-c", req["cmd"]],
            req["env"],
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
            ],
            setsid=True,
            setsigmask=(),
            setsigdef=_DEFAULT_SIGNALS,
        )
    except OSError as e:
        os.write(st_w, json.dumps({"error": "cannot start /bin/sh: " + e.strerror, "errno": e.errno}).encode())
        os._exit(0)
    os.close(out_w)
    os.close(err_w)
    timed_out = False
    status = 0
    signal.setitimer(signal.ITIMER_REAL, max(float(req["timeout"]), 0.001))
    try:
        _, status = os.waitpid(pid, 0)
    except _Stop:
        timed_out = True
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if timed_out:
        _kill_tree(os.getpid())
        code = 124
    elif os.WIFSIGNALED(status):
        code = -os.WTERMSIG(status)
    else:
        code = os.WEXITSTATUS(status)
    os.write(st_w, json.dumps({"exit": code, "timed_out": timed_out}).encode())
    os._exit(0)


class _Exec:
    def __init__(self, rid, req, pid, out_r, err_r, st_r):
        self.rid, self.pid = rid, pid
        self.limit = int(req.get("limit", 1 << 20))
        self.timeout = float(req["timeout"])
        self.fds = {out_r: bytearray(), err_r: bytearray()}
        self.out_r, self.err_r, self.st_r = out_r, err_r, st_r
        self.status = bytearray()
        self.truncated = False
        self.t0 = time.monotonic()


class Init:
    def __init__(self, rfd, wfd):
        self.rfd, self.wfd = rfd, wfd
        self.inbuf = bytearray()
        self.execs = {}
        self.owner = {}  # fd -> _Exec
        self.poll = select.poll()
        self.poll.register(rfd, select.POLLIN)

    # -- wire -------------------------------------------------------------------------
    def send(self, msg, payload=b""):
        head = json.dumps(msg).encode()
        data = HDR.pack(len(head), len(payload)) + head + payload
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.wfd, view)
            except BlockingIOError:
                select.select([], [self.wfd], [])
                continue
            view = view[n:]

    def reply(self, rid, payload=b"", **fields):
        fields.update(id=rid, ok=True)
        self.send(fields, payload)

    def fail(self, rid, err):
        self.send(
            {
                "id": rid,
                "ok": False,
                "error": str(getattr(err, "strerror", None) or err),
                "errno": getattr(err, "errno", None) or 0,
            }
        )

    # -- requests ---------------------------------------------------------------------
    def handle(self, req, payload):
        op, rid = req.get("op"), req.get("id")
        try:
            if op == "exec":
                self.start_exec(rid, req)
            elif op == "read":
                with open(req["path"], "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if size > int(req["limit"]):
                        raise OSError(27, "file is %d bytes, over the %d-byte limit" % (size, int(req["limit"])))
                    self.reply(rid, f.read())
            elif op == "write":
                parent = os.path.dirname(req["path"])
                if parent:
                    os.makedirs(parent, exist_ok=True)
                fd = os.open(req["path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, int(req["mode"]))
                try:
                    view = memoryview(payload)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fchmod(fd, int(req["mode"]))
                finally:
                    os.close(fd)
                self.reply(rid)
            elif op == "kill":
                ex = self.execs.get(req["target"])
                if ex is not None:
                    try:
                        os.kill(ex.pid, signal.SIGTERM)
                    except OSError:
                        pass
                self.reply(rid)
            elif op == "ping":
                self.reply(rid, pid=os.getpid())
            elif op == "close":
                self.reply(rid)
                os._exit(0)
            else:
                raise ValueError("unknown op %r" % (op,))
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.fail(rid, e)

    def start_exec(self, rid, req):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            for fd in (out_r, out_w, err_r, err_w, st_r, st_w):
                os.close(fd)
            raise
        if pid == 0:
            try:
                for fd in {out_r, err_r, st_r, self.rfd, self.wfd}:
                    os.close(fd)
                _shepherd(req, out_w, err_w, st_w)
            except BaseException as e:
                os.write(st_w, json.dumps({"error": "shepherd: %r" % (e,), "errno": 0}).encode())
            finally:
                os._exit(127)
        for fd in (out_w, err_w, st_w):
            os.close(fd)
        ex = _Exec(rid, req, pid, out_r, err_r, st_r)
        self.execs[rid] = ex
        for fd in (out_r, err_r, st_r):
            os.set_blocking(fd, False)
            self.owner[fd] = ex
            self.poll.register(fd, select.POLLIN)

    def on_output(self, fd, ex):
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if fd == ex.st_r:
            if chunk:
                ex.status += chunk
            else:
                self.finish(ex)
            return
        if not chunk:
            self.drop(fd)
            return
        buf = ex.fds[fd]
        room = ex.limit - len(buf)
        if len(chunk) > room:
            ex.truncated = True
            chunk = chunk[: max(room, 0)]
        buf += chunk

    def drop(self, fd):
        if self.owner.pop(fd, None) is not None:
            self.poll.unregister(fd)
            os.close(fd)

    def finish(self, ex):
        for fd in (ex.out_r, ex.err_r):  # the command has exited: what it wrote is in the pipe
            while fd in self.owner:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                room = ex.limit - len(ex.fds[fd])
                if len(chunk) > room:
                    ex.truncated = True
                ex.fds[fd] += chunk[: max(room, 0)]
        for fd in (ex.out_r, ex.err_r, ex.st_r):
            self.drop(fd)
        del self.execs[ex.rid]
        try:
            st = json.loads(ex.status.decode() or "{}")
        except ValueError:
            st = {}
        if "error" in st:
            self.send({"id": ex.rid, "ok": False, "error": st["error"], "errno": st.get("errno", 0)})
            return
        if "exit" not in st:  # the shepherd itself was killed (e.g. by the OOM killer)
            st = {"exit": -9, "timed_out": False}
        try:
            vfs = os.statvfs("/")
            free = vfs.f_bavail * vfs.f_frsize
        except OSError:
            free = -1
        out, err = bytes(ex.fds[ex.out_r]), bytes(ex.fds[ex.err_r])
        self.reply(
            ex.rid,
            out + err,
            exit=st["exit"],
            timed_out=st["timed_out"],
            truncated=ex.truncated,
            duration=time.monotonic() - ex.t0,
            out_len=len(out),
            disk_free=free,
        )

    # -- loop -------------------------------------------------------------------------
    def run(self):
        self.send({"op": "ready", "pid": os.getpid()})
        while True:
            try:
                events = self.poll.poll(500)
            except InterruptedError:
                events = []
            for fd, _ in events:
                if fd == self.rfd:
                    self.on_request()
                elif fd in self.owner:
                    self.on_output(fd, self.owner[fd])
            _reap_all()  # pid 1 adopts every orphan of the sandbox

    def on_request(self):
        chunk = os.read(self.rfd, 1 << 20)
        if not chunk:
            os._exit(0)  # the host went away: so does the sandbox
        self.inbuf += chunk
        while len(self.inbuf) >= HDR.size:
            jlen, plen = HDR.unpack_from(self.inbuf)
            if jlen > MAX_JSON:
                os._exit(3)
            if len(self.inbuf) < HDR.size + jlen + plen:
                return
            req = json.loads(bytes(self.inbuf[HDR.size : HDR.size + jlen]))
            payload = bytes(self.inbuf[HDR.size + jlen : HDR.size + jlen + plen])
            del self.inbuf[: HDR.size + jlen + plen]
            self.handle(req, payload)


def serve(rfd, wfd):
    """Run the init loop on the given file descriptors; never returns."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    for fd in (0, 1, 2):  # keep 0-2 taken, or pipes would land there and dup2 would clash
        try:
            os.fstat(fd)
        except OSError:
            os.open("/dev/null", os.O_RDWR)
    for fd in (rfd, wfd):
        os.set_inheritable(fd, False)  # commands are spawned with 0-2 only
    # Forked shepherds share these pages: keep collections from touching them. No collect()
    # first: the local backend's zygote froze its heap before forking us, and walking every
    # object here would copy each page it touches (~4 ms of a ~20 ms start).
    gc.freeze()
    try:
        Init(rfd, wfd).run()
    finally:
        os._exit(1)


MS_NOSUID, MS_NODEV, MS_MOVE, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8192, 4096, 16384, 1 << 18
MS_RDONLY, MS_NOEXEC, MS_REMOUNT = 1, 8, 32
SYS_CPU_FILES = ("online", "possible", "present")


def ro_mount_unnamed(src, dst, empty, mount, umount):
    """Mount `src` read-only at `dst` so that the sandbox's mountinfo names no host path.

    A bind mount shows its source's path (`/work/…/docs /opt/docs`); a read-only overlay
    of `src` and an empty dir, named by file descriptor, shows `/proc/self/fd/N` instead.
    A file is bound from such an overlay of its directory, mounted at a staging point that
    is detached right after (its mountinfo root is then just `/<name>`). `empty` is an
    empty directory of the sandbox's own; `umount(path)` detaches."""
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV

    def overlay(lower, at):
        fds = [os.open(lower, os.O_PATH | os.O_DIRECTORY), os.open(empty, os.O_PATH | os.O_DIRECTORY)]
        try:
            mount("overlay", at, "overlay", flags, "lowerdir=/proc/self/fd/%d:/proc/self/fd/%d" % tuple(fds))
        finally:
            for fd in fds:
                os.close(fd)

    if os.path.isdir(src):
        overlay(src, dst)
        return
    stage = empty + ".stage"
    os.makedirs(stage, mode=0o755, exist_ok=True)
    overlay(os.path.dirname(src) or "/", stage)
    try:
        mount(stage + "/" + os.path.basename(src), dst, None, MS_BIND, None)
        mount(None, dst, None, MS_REMOUNT | MS_BIND | flags, None)
    finally:
        umount(stage)


def synthetic_sys(target, mount):
    """Put a small read-only tmpfs at `target` (a sandbox's /sys) instead of sysfs.

    A sysfs mounted in a sandbox is the host's: its block devices, PCI tree, DMI strings,
    cgroup paths naming the container. Nothing a task needs lives there; the CPU lists are
    copied because C libraries size thread pools from them (glibc falls back to /proc).
    `mount` is the caller's mount(source, target, fstype, flags, data) wrapper."""
    cpus = {}
    for name in SYS_CPU_FILES:
        try:
            with open("/sys/devices/system/cpu/" + name) as f:
                cpus[name] = f.read()
        except OSError:
            pass
    os.makedirs(target, mode=0o755, exist_ok=True)
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=755,size=64k")
    os.makedirs(target + "/devices/system/cpu", mode=0o755)
    for name, text in cpus.items():
        with open(target + "/devices/system/cpu/" + name, "w") as f:
            f.write(text)
    mount(None, target, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


CAP_SYS_CHROOT, CAP_SYS_ADMIN, PR_CAPBSET_DROP, PR_SET_DUMPABLE = 18, 21, 24, 4
PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 38, 39


def read_blob(fd):
    """One length-prefixed blob from `fd`: 10 ASCII digits (its length), then its bytes."""

    def exactly(n):
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError("stdin closed %d bytes short" % (n - len(data)))
            data += chunk
        return data

    return exactly(int(exactly(10)))


def enter_private_root(disk_mb, keep):
    """Docker: move into an overlay of the image whose writable layer is a tmpfs of
    `disk_mb` (the disk quota, as in the local backend), keeping /proc, /dev and the
    read-only binds `keep`, with a synthetic /sys (`synthetic_sys`); then give up CAP_SYS_ADMIN for good (bounding
    set and own sets)
    and CAP_SYS_CHROOT, and become non-dumpable, so nothing started later can mount, leave
    the new root or inspect this process."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def call(ret, what):
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))

    def mount(src, dst, fstype, flags, data=None):
        enc = lambda v: v.encode() if v is not None else None  # noqa: E731
        call(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount %s" % dst)

    base = "/.legorl-root"
    lower, rw = base + "/lower", base + "/rw"
    for d in (lower, rw):
        os.makedirs(d, exist_ok=True)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("/", lower, None, MS_BIND)  # not recursive: the image's own files only
    mount("tmpfs", rw, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=755" % disk_mb)
    for d in ("upper", "work", "root"):
        os.mkdir(rw + "/" + d, 0o755)
    root = rw + "/root"
    # Named by file descriptor, as the local backend does: the mount table shows them as given.
    fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in (lower, rw + "/upper", rw + "/work")]
    opts = (
        "lowerdir=/proc/self/fd/%d,upperdir=/proc/self/fd/%d,workdir=/proc/self/fd/%d,redirect_dir=off,metacopy=off,index=off"
        % tuple(fds)
    )
    try:
        mount("overlay", root, "overlay", 0, opts)
    finally:
        for fd in fds:
            os.close(fd)
    synthetic_sys(root + "/sys", mount)  # not the container's sysfs, which is the host's
    os.mkdir(rw + "/empty", 0o755)

    def umount(path):
        call(libc.umount2(path.encode(), 2), "umount %s" % path)  # MNT_DETACH

    for item in ["/proc", "/dev"] + list(keep):
        path, src = (item, item) if isinstance(item, str) else (item[0], item[1])
        if os.path.exists(src):
            if os.path.isdir(src):
                os.makedirs(root + path, exist_ok=True)
            elif not os.path.exists(root + path):
                os.makedirs(os.path.dirname(root + path), exist_ok=True)
                open(root + path, "a").close()
            if path in ("/proc", "/dev"):
                mount(path, root + path, None, MS_BIND | MS_REC)
                continue
            # Docker's bind of a host path (a file comes as [target, file in a bound dir]):
            # re-mounted so that no host path shows in the sandbox's mountinfo.
            try:
                ro_mount_unnamed(src, root + path, rw + "/empty", mount, umount)
            except OSError:  # e.g. overlayfs' stacking limit: a bind, naming its host path
                mount(src, root + path, None, MS_BIND | MS_REC)
    # Docker's seccomp profile forbids pivot_root: switch roots as an initramfs does (move
    # the new root over "/", chroot into it). Without CAP_SYS_CHROOT, dropped below, no
    # process can climb back out to the container's own (quota-free) filesystem.
    os.chdir(root)
    mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    call(libc.syscall(125, header, data), "capget")
    for cap in (CAP_SYS_ADMIN, CAP_SYS_CHROOT):
        call(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop capability %d from the bounding set" % cap)
        for i in range(3):  # (effective, permitted, inheritable) of the low 32 capabilities
            data[i] &= ~(1 << cap)
    call(libc.syscall(126, header, data), "capset")
    call(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def install_filter(seccomp_src):
    """Docker: set no_new_privs and install the seccomp filter of `seccomp.py`, whose source
    `seccomp_src` the host sent after this file's, on this (only) thread; every command,
    forked from here, inherits it. Runs after enter_private_root: its mounts come first, and
    without CAP_SYS_ADMIN the kernel takes a filter only under no_new_privs (Docker's
    no-new-privileges already set it; setting it again is harmless). Raises if it cannot."""
    import ctypes
    import types

    module = types.ModuleType("seccomp")
    module.__file__ = "legorl-seccomp"
    exec(compile(seccomp_src, module.__file__, "exec", dont_inherit=True), module.__dict__)  # noqa: S102
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        err = ctypes.get_errno()
        raise OSError(err, "prctl(PR_SET_NO_NEW_PRIVS): %s" % os.strerror(err))
    module.install()


if __name__ == "__main__":
    # Docker: stdin/stdout are the attached stream; nothing else may write to stdout.
    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    sys.stdout = sys.stderr
    config = json.loads(os.environ.pop("LEGORL_INIT_CONFIG", "{}"))
    step = "read the seccomp filter's source"
    try:
        seccomp_src = read_blob(rfd)
        if config.get("disk_mb"):
            step = "enter the private root"
            enter_private_root(int(config["disk_mb"]), config.get("keep", []))
        step = "install the seccomp filter"
        install_filter(seccomp_src)
    except Exception as e:  # the host must learn why, not just see the stream close
        head = json.dumps({"op": "error", "error": "cannot %s: %s: %s" % (step, type(e).__name__, e)}).encode()
        os.write(wfd, HDR.pack(len(head), 0) + head)
        os._exit(1)
    serve(rfd, wfd)
