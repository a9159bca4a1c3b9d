"""The harness seam: what the rollout needs from a harness, and what a native adapter is.

The rollout's side (`legorl/rollout.py`) knows a harness only through the protocols here:
`Harness` (`run(sb, task, proxy_url, repo_dir, timeout_s) -> AgentRun`), `InstalledHarness`
(it brings read-only layers to mount) and `HostHarness` (its own process runs beside the
sandboxes, warm across rollouts). `AgentRun` is how one run ended: evidence, not a verdict.

A native adapter (`NativeAdapter`, the one base all of them share) only CONFIGURES and
LAUNCHES an unmodified harness (Claude Code, OpenCode, the OpenHands SDK, mini-swe-agent, …)
inside the agent sandbox: it writes config files and environment (the proxy session's base
URL, the model name, a turn limit, no telemetry, no auto-update, no permission prompts, a
fresh HOME), builds the command line, and afterwards reads the harness's own result (its
JSON events, result file or trajectory) to say how the run ended. It never patches the
harness. The harness itself comes from a read-only layer (`install.py`) that the rollout
mounts into the sandbox (`mounts`).

How a run ended maps to a status (`legorl.types.Status`) in one place per harness
(`interpret`), with these rules:

- a normal end (the harness finished by its own logic) → `None`: the rollout grades it;
- the harness hit its turn/step/iteration limit → `max_turns` (agent-caused);
- our wall-clock timeout killed it → `agent_timeout` (agent-caused);
- it could not start, crashed, or its proxy session broke (5xx, connection refused, an
  API error the policy cannot have caused) → `engine_error` / `infra_error`, which the
  rollout retries in a fresh sandbox and finally masks.
A context overflow the harness could not compact its way out of is the policy's doing
(its context grew too long), so it is graded like a normal end, with a detail saying so.
"""

from __future__ import annotations

import abc
import asyncio
import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from legorl.harness.install import HarnessNotInstalled, require
from legorl.sandbox.base import ExecResult, Sandbox
from legorl.types import Status, Task

MAX_TURNS = 8  # the one default of a harness's turn/step limit ([harness] max_turns, every adapter)
AGENT_DIR = "/tmp/.legorl-agent"  # the harness's own files in the agent sandbox (problem, config, outputs)


@dataclass
class AgentRun:
    """How one harness run ended (evidence, not a verdict)."""

    exit_code: int
    timed_out: bool = False
    resource_exhausted: bool = False
    duration_s: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""
    # A harness (or the proxy behind it) may already know the run's status, e.g. max_turns,
    # format_error or engine_error; None lets the rollout decide from the diff and the tests.
    status: Status | None = None
    details: dict[str, str] = field(default_factory=dict)


class Harness(Protocol):
    """What the rollout needs from a harness adapter."""

    name: str

    async def run(
        self, sb: Sandbox, task: Task, proxy_url: str | None, repo_dir: str, timeout_s: float
    ) -> AgentRun: ...


@runtime_checkable
class InstalledHarness(Protocol):
    """A harness program that brings its installation as read-only layers (sandbox path →
    host directory, legorl/harness/install.py), mounted into its agent sandbox."""

    readonly_mounts: dict[str, str]


class HarnessProcess(Protocol):
    """What the worker and the benches see of a host harness's process (`warm.WarmDriver`):
    the OS process, while one runs (its pid, its return code)."""

    proc: asyncio.subprocess.Process | None


@runtime_checkable
class HostHarness(Protocol):
    """A harness whose own process runs beside the sandboxes, warm across rollouts
    (`warm_mini.py`, `openhands_warm.py`): only its actions run in the agent sandbox. Its
    `run` gets the session's host-side URL, and the sandbox gets no proxy socket (no network
    at all). Started once by the worker (`start`), closed with it (`aclose`), replaced once
    idle when it may be wedged (`retire`: a rollout ran out its time before one model call);
    `driver` is its process (`warm.WarmDriver`)."""

    name: str
    driver: HarnessProcess

    async def start(self) -> None: ...

    async def retire(self) -> None: ...

    async def aclose(self) -> None: ...

    async def run(
        self, sb: Sandbox, task: Task, proxy_url: str | None, repo_dir: str, timeout_s: float
    ) -> AgentRun: ...


HOME = f"{AGENT_DIR}/home"
PROBLEM_FILE = f"{AGENT_DIR}/problem.md"
API_KEY = "legorl"  # clients insist on a key; the session socket pins the session anyway

# Environment every harness gets: a fresh HOME (config, transcripts, caches live there and
# die with the sandbox), UTF-8, and no proxy variables that could route around the session.
COMMON_ENV = {
    "HOME": HOME,
    "XDG_CONFIG_HOME": f"{HOME}/.config",
    "XDG_DATA_HOME": f"{HOME}/.local/share",
    "XDG_CACHE_HOME": f"{HOME}/.cache",
    "XDG_STATE_HOME": f"{HOME}/.local/state",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "CI": "1",
    "HTTP_PROXY": "",
    "HTTPS_PROXY": "",
    "http_proxy": "",
    "https_proxy": "",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


@dataclass
class Launch:
    """What an adapter wants done in the sandbox: files, then one command, then outputs."""

    command: str  # run with /bin/sh in the repository; should `exec` the harness
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)  # sandbox path -> content
    outputs: dict[str, str] = field(default_factory=dict)  # name -> sandbox path read back after the run
    binary: str = ""  # checked to be executable before launching (a missing layer is infra)


@dataclass
class HarnessVerdict:
    """An adapter's reading of how its harness ended."""

    status: Status | None  # None: a normal end, to be graded
    details: dict[str, str] = field(default_factory=dict)


class NativeAdapter(abc.ABC):
    """The base of every native adapter (a frozen dataclass per harness program): it says its
    layers, how to launch the harness (`launch`) and how to read its ending (`interpret`),
    and inherits the rollout's two hooks, the same for all of them: the layers to mount
    read-only at their own paths (`readonly_mounts`, so it is an `InstalledHarness`) and the
    run (`run`: launch, wait, read the outputs, interpret; so it is a `Harness`). `launch` and
    `interpret` are abstract: an adapter missing one fails when it is constructed, not in
    the middle of a rollout."""

    name: str
    layers: tuple[str, ...]

    @abc.abstractmethod
    def launch(self, task: Task, base_url: str, repo_dir: str) -> Launch:
        """The files to write and the command that runs the harness on `task` in `repo_dir`."""

    @abc.abstractmethod
    def interpret(self, res: ExecResult, outputs: dict[str, str], launch: Launch) -> HarnessVerdict:
        """How the harness ended, from its exit (`res`) and the output files it left."""

    @property
    def readonly_mounts(self) -> dict[str, str]:
        return mounts(self)

    async def run(self, sb: Sandbox, task: Task, proxy_url: str | None, repo_dir: str, timeout_s: float) -> AgentRun:
        return await run_native(self, sb, task, proxy_url, repo_dir, timeout_s)


def infra(message: str, status: Status = Status.INFRA_ERROR) -> HarnessVerdict:
    return HarnessVerdict(status, {"error": message[-2000:]})


def jsonl(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL text (a cut-off first line and non-JSON lines skipped)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def http_status_is_infra(status: int | None) -> bool:
    """An HTTP failure the policy cannot have caused: 5xx, auth/route errors, no status."""
    if status is None:
        return True
    return status >= 500 or status in (401, 403, 404, 405, 408, 413, 429)


def mounts(adapter: NativeAdapter) -> dict[str, str]:
    """Read-only host→sandbox mounts of the adapter's layers (HarnessNotInstalled if absent)."""
    out: dict[str, str] = {}
    for layer in adapter.layers:
        p = str(require(layer))
        out[p] = p
    return out


async def run_native(
    adapter: NativeAdapter, sb: Sandbox, task: Task, proxy_url: str | None, repo_dir: str, timeout_s: float
) -> AgentRun:
    """Launch `adapter`'s harness in `sb` against the proxy session and read how it ended."""
    if not proxy_url:
        return _run_of(infra(f"{adapter.name}: no proxy session for the harness to talk to"))
    try:
        launch = adapter.launch(task, proxy_url.rstrip("/"), repo_dir)
    except HarnessNotInstalled as e:
        return _run_of(infra(str(e)))
    files = {PROBLEM_FILE: task.problem_statement.encode(), **launch.files}
    dirs = sorted({p.rsplit("/", 1)[0] for p in files} | {HOME, f"{HOME}/.config"})
    prep = await sb.exec("mkdir -p " + " ".join(shlex.quote(d) for d in dirs), timeout_s=30, cwd="/")
    if prep.exit_code != 0:
        return _run_of(infra(f"{adapter.name}: cannot prepare {AGENT_DIR}: {prep.stderr}"))
    for path, data in files.items():
        await sb.write_file(path, data, mode=0o755 if path.endswith((".sh", ".py")) else 0o644)
    if launch.binary:
        check = await sb.exec(f"test -x {shlex.quote(launch.binary)}", timeout_s=30, cwd="/")
        if check.exit_code != 0:
            return _run_of(infra(f"{adapter.name}: {launch.binary} is not in the sandbox (harness layer not mounted?)"))
    env = {**COMMON_ENV, **launch.env}
    res = await sb.exec(launch.command, timeout_s=timeout_s, cwd=repo_dir, env=env)
    outputs: dict[str, str] = {}
    for name, path in launch.outputs.items():
        try:
            outputs[name] = (await sb.read_file(path)).decode("utf-8", errors="replace")
        except OSError:  # the harness never wrote it: its interpret() says what that means
            outputs[name] = ""
    if res.timed_out:
        verdict = HarnessVerdict(
            Status.AGENT_TIMEOUT, {"error": f"{adapter.name} ran past {timeout_s:g} s and was killed"}
        )
    elif res.oom_killed:
        verdict = HarnessVerdict(
            Status.AGENT_CRASH, {"error": f"{adapter.name} was killed by the out-of-memory killer"}
        )
    else:
        verdict = adapter.interpret(res, outputs, launch)
    details = dict(verdict.details)
    details.setdefault("harness", adapter.name)
    return AgentRun(
        exit_code=res.exit_code,
        timed_out=res.timed_out,
        resource_exhausted=res.resource_exhausted,
        duration_s=res.duration_s,
        stdout_tail=(res.stdout or outputs.get("stdout", "") or outputs.get("events", ""))[-4000:],
        stderr_tail=(res.stderr or outputs.get("stderr", ""))[-4000:],
        status=verdict.status,
        details=details,
    )


def _run_of(verdict: HarnessVerdict) -> AgentRun:
    return AgentRun(exit_code=-1, status=verdict.status, details=verdict.details)


__all__ = [
    "API_KEY",
    "AGENT_DIR",
    "AgentRun",
    "COMMON_ENV",
    "HOME",
    "Harness",
    "HarnessProcess",
    "HostHarness",
    "InstalledHarness",
    "Launch",
    "NativeAdapter",
    "PROBLEM_FILE",
    "HarnessVerdict",
    "http_status_is_infra",
    "infra",
    "jsonl",
    "mounts",
    "run_native",
]
