"""The local backend's zygote: a small single-threaded process that forks sandboxes.

Why a zygote: the process that uses sandboxes is multi-threaded (asyncio, uvicorn, torch),
and such a process must not run Python between fork and exec. The zygote is started once
per backend with `python -I -S` and the standard library only, so a sandbox costs a fork
of a small process plus a handful of syscalls instead of an interpreter start.

For each `spawn` request (a JSON message on a SOCK_SEQPACKET socket, with the sandbox's
control socket passed as an fd), the zygote forks a child that becomes pid 1 of a new pid
namespace and, in order:
  1. joins the sandbox's cgroups (created and limited by the host beforehand);
  2. unshares mount, network, ipc, uts and cgroup namespaces;
  3. mounts a size-limited tmpfs (the disk quota) holding the overlay's upper and work dirs,
     the overlay of the image's read-only layers on top (named by file descriptor, so no
     host path shows in the sandbox's mountinfo), then a minimal /dev, /proc (masked like
     Docker does, with the sandbox's own /dev/null), a synthetic read-only /sys (not the
     host's sysfs), the requested read-only bind mounts;
  4. brings up `lo`, sets the hostname, pivots into the overlay and detaches the host's
     filesystem completely;
  5. moves into a new user namespace (identity-mapped by a short-lived helper), so that
     the sandbox keeps root's file permissions but holds no capability over any of its
     namespaces (it cannot mount, unmount, reconfigure the network or load modules);
     drops the capability bounding set to Docker's default set, sets no_new_privs, makes
     itself non-dumpable (so nothing inside can ptrace or read it), shields itself from
     the OOM killer, and installs the seccomp filter of `seccomp.py` (Docker's default
     profile's denials: no unshare/setns/mount, keyrings, bpf, io_uring…), which every
     command inherits; if it cannot be installed the start fails;
  6. runs `init.serve` on the control socket.
Nothing survives the sandbox: when its pid 1 exits, the kernel kills every process in the
pid namespace and the mount namespace with its tmpfs disappears. Pid 1 dies with the
zygote (PDEATHSIG) and the zygote dies with the host (PDEATHSIG and EOF on its socket).

Replies: {id, pid} once forked ({id, error} if the fork failed), and {exited: id, status}
when the sandbox's pid 1 has been reaped.

A host that dies (even by SIGKILL) with replies still unread resets the socket: the zygote
reads that as the end, like EOF, and exits quietly (it shares the host's console, and its
PDEATHSIG can arrive after the reset).
"""

import gc
import json
import os
import select
import signal
import socket
import sys

# Started as `legorl-sandbox -I -S -` with this file on stdin, so that nothing in a sandbox's
# /proc/1/cmdline names a host path; the directory of the helpers comes in the environment.
sys.path.insert(
    0, os.environ.get("LEGORL_SANDBOX_DIR") or os.path.dirname(os.path.abspath(globals().get("__file__", ".")))
)

import init  # noqa: E402
import linux as L  # noqa: E402
import seccomp  # noqa: E402  (builds the filter once, here, not per sandbox)

NS_FLAGS = L.CLONE_NEWNS | L.CLONE_NEWNET | L.CLONE_NEWIPC | L.CLONE_NEWUTS | L.CLONE_NEWCGROUP
MASK_FILES = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats", "timer_stats")
MASK_DIRS = ("acpi", "scsi", "asound")
RO_PROC = ("bus", "fs", "irq", "sys", "sysrq-trigger")
DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0))
OVERLAY_OPTS = "redirect_dir=off,metacopy=off,index=off"


def _fail(ctl, msg):
    head = json.dumps({"op": "error", "error": msg}).encode()
    try:
        os.write(ctl, init.HDR.pack(len(head), 0) + head)
    finally:
        os._exit(1)


def _ro_bind(src, dst, flags=0):
    L.mount(src, dst, None, L.MS_BIND)
    L.mount(None, dst, None, L.MS_REMOUNT | L.MS_BIND | L.MS_RDONLY | L.MS_NOSUID | L.MS_NODEV | flags)


def _mkdirs(path):
    os.makedirs(path, mode=0o755, exist_ok=True)


def _setup_dev(root):
    dev = root + "/dev"
    _mkdirs(dev)
    L.mount("tmpfs", dev, "tmpfs", L.MS_NOSUID | L.MS_STRICTATIME, "mode=755,size=65536k")
    for name, major, minor in DEVICES:
        os.mknod(dev + "/" + name, 0o666 | 0o020000, os.makedev(major, minor))
        os.chmod(dev + "/" + name, 0o666)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
        ("core", "/proc/kcore"),
    ):
        os.symlink(target, dev + "/" + name)
    os.mkdir(dev + "/pts")
    L.mount("devpts", dev + "/pts", "devpts", L.MS_NOSUID | L.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    os.mkdir(dev + "/shm")
    L.mount("shm", dev + "/shm", "tmpfs", L.MS_NOSUID | L.MS_NODEV | L.MS_NOEXEC, "mode=1777,size=65536k")


def _setup_proc(root):
    proc = root + "/proc"
    _mkdirs(proc)
    L.mount("proc", proc, "proc", L.MS_NOSUID | L.MS_NODEV | L.MS_NOEXEC)
    for name in MASK_FILES:  # the sandbox's own /dev/null: the host's devtmpfs would show in mountinfo
        if os.path.exists(proc + "/" + name):
            L.mount(root + "/dev/null", proc + "/" + name, None, L.MS_BIND)
    for name in MASK_DIRS:
        if os.path.isdir(proc + "/" + name):
            L.mount("tmpfs", proc + "/" + name, "tmpfs", L.MS_RDONLY)
    for name in RO_PROC:
        if os.path.exists(proc + "/" + name):
            _ro_bind(proc + "/" + name, proc + "/" + name)


def _setup_root(req):
    """Steps 2-4 of the module docstring; returns nothing, raises OSError on failure."""
    L.unshare(NS_FLAGS)
    L.mount(None, "/", None, L.MS_REC | L.MS_PRIVATE)
    scratch = req["scratch"]
    if req.get("upper"):  # an image build: the upper dir is the new layer, on the host
        upper, work, root = req["upper"], req["work"], scratch
    else:
        L.mount("tmpfs", scratch, "tmpfs", L.MS_NOSUID | L.MS_NODEV, "mode=755,size=%dm" % req["disk_mb"])
        upper, work, root = scratch + "/upper", scratch + "/work", scratch + "/root"
        for d in (upper, work, root):
            os.mkdir(d, 0o755)
    # The layers are named by file descriptor: overlayfs shows its options as given in the
    # sandbox's mountinfo, and host paths (image store, scratch dir) have no business there.
    fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in [*req["lowers"], upper, work]]
    names = ["/proc/self/fd/%d" % fd for fd in fds]
    opts = "lowerdir=%s,upperdir=%s,workdir=%s,%s" % (":".join(names[:-2]), names[-2], names[-1], OVERLAY_OPTS)
    try:
        L.mount("overlay", root, "overlay", 0, opts)
    finally:
        for fd in fds:
            os.close(fd)
    _setup_dev(root)
    _setup_proc(root)
    init.synthetic_sys(root + "/sys", L.mount)  # not sysfs, which is the host's
    if req["mounts"] and not req.get("upper"):
        os.mkdir(scratch + "/empty", 0o755)
    for host, target in req["mounts"]:
        dst = root + "/" + target.lstrip("/")
        if os.path.isdir(host):
            _mkdirs(dst)
        else:
            _mkdirs(os.path.dirname(dst))
            if not os.path.exists(dst):
                open(dst, "a").close()
        if req.get("upper"):  # an image build (task-owned setup, no agent code): a plain bind
            _ro_bind(host, dst)
        else:
            try:
                init.ro_mount_unnamed(host, dst, scratch + "/empty", L.mount, lambda p: L.umount2(p, L.MNT_DETACH))
            except OSError:  # e.g. overlayfs' stacking limit: a bind, naming its host path
                _ro_bind(host, dst)
    L.sethostname(req.get("hostname", "sandbox"))
    L.loopback_up()
    with open("/proc/sys/net/ipv4/ip_unprivileged_port_start", "w") as f:
        f.write("0")  # root inside holds no net capability: let it bind low ports anyway
    try:  # commands raise theirs (see init.py), so the OOM killer takes them, not pid 1
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("-1000")
    except OSError:
        pass  # without CAP_SYS_RESOURCE: the commands' higher score still protects pid 1
    os.chdir(root)
    L.pivot_root(".", ".")
    L.umount2(".", L.MNT_DETACH)
    os.chdir("/")


def _enter_userns():
    """Step 5: a new user namespace, identity-mapped by a helper that stays privileged."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        code = 1
        try:
            os.read(go_r, 1)
            for name in ("uid_map", "gid_map"):
                with open("/proc/1/" + name, "w") as f:
                    f.write("0 0 4294967295\n")
            code = 0
        finally:
            os.write(done_w, bytes([code]))
            os._exit(code)
    L.unshare(L.CLONE_NEWUSER)
    os.write(go_w, b"x")
    ok = os.read(done_r, 1) == b"\x00"
    os.waitpid(helper, 0)
    for fd in (go_r, go_w, done_r, done_w):
        os.close(fd)
    if not ok:
        raise OSError(1, "writing the sandbox's uid/gid map failed")
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    L.drop_capabilities()
    L.prctl(L.PR_SET_NO_NEW_PRIVS, 1)
    L.prctl(L.PR_SET_DUMPABLE, 0)


def _sandbox_main(req, ctl):
    """The forked child: pid 1 of the new pid namespace. Never returns."""
    try:
        L.prctl(L.PR_SET_PDEATHSIG, signal.SIGKILL)  # (if the zygote is already gone, EOF on ctl ends us)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for procs in req["cgroups"]:
            with open(procs, "w") as f:
                f.write("0")
        _setup_root(req)
        _enter_userns()
        seccomp.install()  # after no_new_privs, before anything of the sandbox runs
        os.closerange(0, ctl)
        os.closerange(ctl + 1, 65536)
    except Exception as e:  # noqa: BLE001 - every failure must reach the host as a message
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        where = "%s:%d" % (tb.tb_frame.f_code.co_name, tb.tb_lineno)
        _fail(ctl, "%s: %s (at %s)" % (type(e).__name__, e, where))
    init.serve(ctl, ctl)


class Zygote:
    def __init__(self, sock):
        self.sock = sock
        self.children = {}  # pid -> request id
        self.my_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def send(self, msg):
        self.sock.send(json.dumps(msg).encode())

    def spawn(self, req, ctl):
        L.unshare(L.CLONE_NEWPID)  # only our next child lands in the new pid namespace:
        try:
            pid = os.fork()
        except OSError:
            L.setns(self.my_pidns, L.CLONE_NEWPID)
            raise
        if pid != 0:
            L.setns(self.my_pidns, L.CLONE_NEWPID)  # ... and later ones do not
        else:
            self.sock.close()
            for fd in (self.wake_r, self.wake_w, self.my_pidns):
                os.close(fd)
            _sandbox_main(req, ctl)
        os.close(ctl)
        self.children[pid] = req["id"]
        self.send({"id": req["id"], "pid": pid})

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rid = self.children.pop(pid, None)
            if rid is not None:
                self.send({"exited": rid, "status": status})

    def run(self):
        poll = select.poll()
        poll.register(self.sock.fileno(), select.POLLIN)
        poll.register(self.wake_r, select.POLLIN)
        while True:
            for fd, _ in poll.poll():
                if fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                    self.reap()
                    continue
                msg, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 4)
                if not msg:
                    return
                req = json.loads(msg)
                if len(fds) != 1:
                    for fd in fds:
                        os.close(fd)
                    self.send({"id": req.get("id"), "error": "spawn needs exactly one control socket"})
                    continue
                try:
                    self.spawn(req, fds[0])
                except OSError as e:
                    os.close(fds[0])
                    self.send({"id": req.get("id"), "error": "fork failed: %s" % e})
            self.reap()


def main():
    L.prctl(L.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:
        return
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)  # stdin was the pipe this file came through
    os.close(devnull)
    sock = socket.socket(fileno=int(os.environ["LEGORL_ZYGOTE_FD"]))
    gc.collect()
    gc.freeze()  # every sandbox is a fork of this heap: its collections must not walk (copy) it
    try:
        Zygote(sock).run()
    except (ConnectionResetError, BrokenPipeError):  # the host is gone: its sandboxes die with us
        pass


if __name__ == "__main__":
    main()
