"""The local backend's zygote outlives a host that dies by SIGKILL only long enough to
notice: the host's socket is reset (replies it never read), and the zygote, which shares
the host's console, must then exit quietly rather than print a ConnectionResetError
traceback onto the console of whoever ran `legorl train`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from legorl.sandbox.local import ZYGOTE_PATH


def test_a_reset_host_socket_ends_the_zygote_quietly() -> None:
    host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen(  # started as the backend starts it (legorl/sandbox/local.py)
        ["legorl-sandbox", "-I", "-S", "-"],
        executable=sys.executable,
        pass_fds=[child.fileno()],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={"LEGORL_ZYGOTE_FD": str(child.fileno()), "LEGORL_SANDBOX_DIR": str(Path(ZYGOTE_PATH).parent)},
    )
    child.close()
    try:
        assert proc.stdin is not None
        proc.stdin.write(Path(ZYGOTE_PATH).read_bytes())
        proc.stdin.close()
        host.send(json.dumps({"op": "spawn", "id": "x"}).encode())  # no control socket: an error reply
        host.settimeout(60)
        assert "error" in json.loads(host.recv(1 << 16))  # the zygote is up and answering
        host.send(json.dumps({"op": "spawn", "id": "y"}).encode())
        time.sleep(0.5)  # its reply now waits, unread, in the host's queue
        host.close()  # what a SIGKILLed host's exit does: the zygote's end is reset
        proc.wait(timeout=30)
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode(errors="replace")
    assert "Traceback" not in text and "ConnectionResetError" not in text, text
    assert proc.returncode == 0
