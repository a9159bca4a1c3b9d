"""Where a quickstart episode's commands run, and how its result is graded.

A workspace is a fresh directory holding the task's repository (calc.py, test_calc.py).
Commands run in it with /bin/sh, merged stdout/stderr, a timeout that kills the whole
process group — what mini-swe-agent's `LocalEnvironment` does, so the in-process path and
the real harness see the same outputs.

Grading never trusts the workspace: `grade_source` writes the agent's final calc.py into
a second fresh directory next to the task's own test file (whatever the agent did to its
copy of the tests is discarded) and runs the test command there. Resolved ⇔ the command
exits 0 and every function's test reports PASS (FAIL_TO_PASS and PASS_TO_PASS both).

`python` in commands is a real CPython found once per run (`fast_python_dir`): the
system interpreter when there is one, because a pyenv shim costs ~0.3 s per call.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from legorl.quickstart.dialogue import load_agent_config
from legorl.quickstart.family import SOURCE_FILE, TEST_CMD, TEST_FILE, QuickTask
from legorl.types import Outcome, Status

_RESULT = re.compile(r"^(PASS|FAIL) (\w+)", re.MULTILINE)


def fast_python_dir(root: Path) -> Path:
    """A directory with a `python` that starts fast, to put first on PATH."""
    bin_dir = root / "bin"
    target = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)), sys.executable)
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "python"
    if not link.exists():
        link.symlink_to(target)
    return bin_dir


def command_env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["PAGER"] = "cat"
    return env


OUTPUT_CAP = 1 << 20  # bytes of a command's output kept; past it the command is killed


class OutputLimitExceeded(OSError):
    def __init__(self, output: str) -> None:
        super().__init__(f"output exceeded {OUTPUT_CAP} bytes; the command was killed")
        self.output = output


def run_command(command: str, cwd: Path, env: dict[str, str], timeout_s: int) -> dict[str, Any]:
    """Run like mini-swe-agent's LocalEnvironment.execute: sh, merged stdout/stderr, the
    whole process group killed on timeout, and any failure to run (a timeout, a NUL byte
    in the command) reported as returncode -1 with the same `exception_info` text.

    One addition: output past `OUTPUT_CAP` bytes kills the command (`yes` would otherwise
    fill the memory of the process running thousands of episodes); the agent then sees
    the first megabyte, head- and tail-truncated by the observation template like any
    long output."""
    try:
        proc = subprocess.Popen(
            command, shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        out, capped = _read_capped(proc, timeout_s)
        text = out.decode("utf-8", errors="replace")
        if capped == "timeout":
            raise subprocess.TimeoutExpired(command, timeout_s, output=text)
        if capped == "cap":
            raise OutputLimitExceeded(text)
        return {"output": text, "returncode": proc.returncode, "exception_info": ""}
    except Exception as e:  # noqa: BLE001 - mini-swe-agent turns every failure into an observation
        raw = getattr(e, "output", None)
        raw = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else (raw or "")
        return {"output": raw, "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}"}  # fmt: skip


def _read_capped(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[bytes, str | None]:
    """All of the process's output, or what came before the timeout / the cap (then the
    process group is killed and the reason returned)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    chunks, size, reason = [], 0, None
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                reason = "timeout"
                break
            if not sel.select(left):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > OUTPUT_CAP:
                reason = "cap"
                break
    if reason is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.stdout.close()
    proc.wait()
    return b"".join(chunks)[:OUTPUT_CAP], reason


def default_timeout() -> int:
    """The harness's per-command timeout (`environment.timeout` of mini_quickstart.yaml)."""
    return int(load_agent_config()["environment"]["timeout"])


def materialise(task: QuickTask, root: Path) -> Path:
    """A fresh directory under `root` holding the task's repository."""
    d = Path(tempfile.mkdtemp(prefix=f"{task.instance_id}-", dir=root))
    for name, text in task.files().items():
        (d / name).write_text(text)
    return d


def grade_source(task: QuickTask, source: str, root: Path, env: dict[str, str], timeout_s: int = 10) -> Outcome:
    """Run the task's own tests against `source` as calc.py in a fresh directory."""
    d = root / f"grade-{uuid.uuid4().hex[:10]}"
    d.mkdir(parents=True)
    try:
        (d / SOURCE_FILE).write_text(source)
        (d / TEST_FILE).write_text(task.test_script())
        res = run_command(TEST_CMD, d, env, timeout_s)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    seen = {name: ("passed" if verdict == "PASS" else "failed") for verdict, name in _RESULT.findall(res["output"])}
    tests = {f"test_{n}": seen.get(n, "missing") for n in task.names}
    resolved = res["returncode"] == 0 and all(v == "passed" for v in tests.values())
    evidence = {"returncode": res["returncode"], "output": res["output"][-2000:]}
    if res["exception_info"]:
        evidence["error"] = res["exception_info"]
    return Outcome(1.0 if resolved else 0.0, Status.RESOLVED if resolved else Status.FAILED, tests=tests, evidence=evidence)


class Workspace(Protocol):
    """Where one episode's commands run and how it is graded (DirWorkspace)."""

    def execute(self, command: str) -> dict[str, Any]: ...

    def grade(self) -> Outcome: ...

    def close(self) -> None: ...


# mini-swe-agent exit statuses that the policy caused, and how they end an episode.
GRADED_EXITS = ("Submitted", "ContextWindowExceededError")  # the policy's context grew too long: its doing
AGENT_EXITS = {"LimitsExceeded": Status.MAX_TURNS, "RepeatedFormatError": Status.FORMAT_ERROR}


def outcome_of(exit_status: str, workspace: Workspace, error: str = "") -> Outcome:
    """Submitted (or out of context) → graded; the agent's own limits → reward 0 with their
    status; anything else (an API error, a crash of the harness) → infra_error, masked."""
    if exit_status in GRADED_EXITS:
        return workspace.grade()
    if exit_status in AGENT_EXITS:
        return Outcome(0.0, AGENT_EXITS[exit_status], evidence={"exit_status": exit_status})
    return Outcome(0.0, Status.INFRA_ERROR, masked=True, evidence={"exit_status": exit_status, "error": error[-2000:]})


class DirWorkspace:
    """One episode's repository directory (implements inproc.Workspace)."""

    def __init__(self, task: QuickTask, root: Path, env: dict[str, str], timeout_s: int | None = None) -> None:
        self.task = task
        self.root = root
        self.env = env
        self.timeout_s = timeout_s if timeout_s is not None else default_timeout()
        self.dir = materialise(task, root)

    def execute(self, command: str) -> dict[str, Any]:
        return run_command(command, self.dir, self.env, self.timeout_s)

    def final_source(self) -> str:
        try:
            return (self.dir / SOURCE_FILE).read_text(errors="replace")
        except OSError:
            return ""  # the agent deleted calc.py: graded as it is (every test fails)

    def grade(self) -> Outcome:
        return grade_source(self.task, self.final_source(), self.root, self.env, self.timeout_s)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
