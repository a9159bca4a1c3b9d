"""The supervising process's own work: become the reaper of what the test run leaves behind
and non-dumpable, plant the canaries (or stop the run as not prepared), read the pipes until
the child and its strays are done, and keep only the records whose HMAC checks.

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""

import hmac
import json
import os
import select
import sys
import time

from lg_canaries import plant

SETUP_FAILED = 86  # exit status when the supervisor itself could not prepare the run (before any repository code)
GRACE_S = 0.5  # how long pipes are drained after the child exits and its strays are killed
INLINE_MAX = 256 << 10  # a larger summary goes to a file (the sandbox cuts a command's output at 1 MB)


def tagged_sender(key, rec_w, encode=None):
    """`send(kind, **fields)`: one HMAC-tagged record (`encode(kind, n, fields)`, JSON by
    default) down the record pipe, the framing `verified_records` checks. Records go out in
    batches (each write wakes the supervisor: ~0.1 ms), and at the session's end; a run that
    dies before then has no report to contradict anyway."""
    write, mac_of = os.write, hmac.digest
    encode = encode or (lambda kind, n, fields: json.dumps(dict(fields, k=kind, n=n)))
    seq = [0]
    pending = []

    def send(kind, **fields):
        seq[0] += 1
        body = encode(kind, seq[0], fields)
        pending.append(mac_of(key, body.encode(), "sha256").hex() + " " + body + "\n")
        if len(pending) >= 64 or kind == "end":
            data = "".join(pending).encode()
            del pending[:]
            while data:
                data = data[write(rec_w, data) :]

    return send


def child_stdio(log_fd):
    """The child's stdout and stderr go to `log_fd` (the log file; the native runner's log pipe),
    its stdin is /dev/null."""
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.dont_write_bytecode = True


def undumpable():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass


def _orphans(me):
    """Our children other than the test child: with this process a child subreaper, every
    descendant the test run left behind (setsid or not) is re-parented here."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me and fields[0] != b"Z":
            out.append(int(p))
    return out


def kill_strays(me):
    """SIGKILL the processes the test run left behind (detached daemons of the code under
    test), before the report is written out, and reap them; how many. Only descendants:
    this also runs on a host (task generation), where other processes are none of ours."""
    killed = set()
    for _ in range(50):  # a stray may fork while we kill; its children come to us in turn
        new = [p for p in _orphans(me) if p not in killed]
        if not new:
            break
        for p in new:
            try:
                os.kill(p, 9)
            except OSError:
                pass
            killed.add(p)
        time.sleep(0.002)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
    return len(killed)


def subreaper():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def collect(pid, fds):
    """Read the pipes `fds` until the child `pid` has exited and their writers are done: at
    most GRACE_S after its exit, then every stray it left is killed and what they held open
    is drained. Returns (the child's wait status, strays killed, bytes read per fd, pipes still
    open after its exit: held by strays)."""
    bufs = {fd: bytearray() for fd in fds}
    status, deadline, strays = None, None, 0
    open_fds = set(bufs)
    while open_fds:
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status, deadline = st, time.monotonic() + GRACE_S
                strays = kill_strays(os.getpid())
        if deadline is not None and time.monotonic() > deadline:
            break
        ready, _, _ = select.select(list(open_fds), [], [], 0.05)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
                continue
            bufs[fd] += chunk
    if status is None:
        _, status = os.waitpid(pid, 0)
        strays = kill_strays(os.getpid())
    for fd in list(open_fds):  # whatever a killed stray held open is closed now
        os.set_blocking(fd, False)
        try:
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                bufs[fd] += chunk
        except BlockingIOError:
            pass
    return status, strays, bufs, len(open_fds)


def verified_records(data, key):
    """The JSON records of the record pipe whose HMAC tag checks, and how many did not: the
    child cannot forge one (it never learns the key)."""
    records, bad = [], 0
    for line in data.split(b"\n"):
        if not line:
            continue
        mac, _, body = line.partition(b" ")
        if not hmac.compare_digest(mac, hmac.digest(key, body, "sha256").hex().encode()):
            bad += 1
            continue
        records.append(json.loads(body))
    return records, bad


def plant_or_stop(pid, spec, nonce):
    """The canaries planted (their ids), or the child killed and the run stopped as not prepared.

    The failure is announced in a line tagged with the nonce, written before the go: the code
    under test has not run yet, and never learns the nonce, so it cannot claim a failure of
    ours (an exit status and a message on stderr it can forge)."""
    try:
        return plant(spec) if spec else None
    except (LookupError, OSError, UnicodeDecodeError) as exc:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        sys.stderr.write("legorl-supervisor: %s\n" % exc)
        sys.stdout.write("\n%s setup-failed %s\n" % (nonce, json.dumps(str(exc)[:500])))
        sys.stdout.flush()
        os._exit(SETUP_FAILED)


def write_summary(nonce, summary, path):
    """The one tagged summary line on stdout: the summary itself, or, when it is large (a task
    with thousands of tests, or strings the code under test inflated), the sha256 of the file
    `path` it is written to (outside the child's reach: it never learns the path), which the
    host reads. Either way it survives the sandbox's output cap."""
    import hashlib

    text = json.dumps(summary, sort_keys=True)
    if len(text) <= INLINE_MAX or not path:
        line = text
    else:
        data = text.encode()
        with open(path, "wb") as f:
            f.write(data)
        line = "file %s %s" % (hashlib.sha256(data).hexdigest(), path)
    sys.stdout.write("\n%s %s\n" % (nonce, line))
    sys.stdout.flush()
