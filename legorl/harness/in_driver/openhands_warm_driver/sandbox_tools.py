"""The SDK's own terminal and file editor tools, executed in a LEGO-RL rollout's sandbox.

Runs in the warm OpenHands driver (the openhands layer's venv, on the host); imports only
the SDK and the standard library. The tools are registered through the SDK's documented
extension point (`register_tool` with a `ToolDefinition` subclass whose `create` is
called with the conversation state), and what they return are the SDK's own tool
definitions, `TerminalTool.create(..., executor=...)` and `FileEditorTool.create(...)`
with `set_executor`:
the name, description, schema and observation rendering the model sees are the SDK's;
only the executor, *where* an action runs, is ours:

- terminal: each command runs with bash (sh if the image has none) in the sandbox, through
  the host's `Sandbox.exec`, stdout and stderr merged, killed at the action's timeout (or
  `command_timeout_s`). The working directory and exported variables carry over to the
  next command, as in the SDK's persistent shell; the observation carries the metadata
  the SDK's PS1 block gives (exit code, working directory, python interpreter). What a
  per-command shell cannot do: `is_input` to a still-running process (answered with the
  SDK's own "No previous running command to interact with."), and background processes
  do not outlive their command.
- file_editor: the SDK's own `FileEditorExecutor` runs on a per-rollout host *mirror*: for
  each action the path is first copied out of the sandbox (a file's bytes; a directory's
  entries two levels deep, as the SDK lists them), then the SDK's editor runs on
  `mirror + path`, and an edited file is written back into the sandbox (its mode kept).
  The mirror holds only regular files and directories it made itself and the path is
  normalised first, so no action reaches outside it; the mirror prefix is removed from
  every observation, so the model sees its sandbox paths only.
"""

from __future__ import annotations

import base64
import os
import posixpath
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from openhands.sdk import TextContent
from openhands.sdk.tool import ToolExecutor, register_tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.file_editor.impl import FileEditorExecutor
from openhands.tools.terminal import TerminalTool
from openhands.tools.terminal.constants import TIMEOUT_MESSAGE_TEMPLATE
from openhands.tools.terminal.definition import TerminalObservation
from openhands.tools.terminal.metadata import CmdOutputMetadata

# Sends one request to the host and blocks for its reply (installed by the driver).
Call = Callable[[dict[str, Any]], dict[str, Any]]
_call: Call | None = None
_rollouts: dict[str, dict[str, Any]] = {}  # rollout id → {"repo", "mirror", "timeout"}
MARK = "__LEGORL_OPENHANDS_STATE__"
# The command arrives in $LEGORL_CMD; the shell's state (cwd, exports) is kept in the
# sandbox between commands, in $LEGORL_STATE.
_SCRIPT = (
    "__legorl_c=$LEGORL_CMD; __legorl_s=$LEGORL_STATE; unset LEGORL_CMD LEGORL_STATE LEGORL_SCRIPT\n"
    '[ -f "$__legorl_s" ] && . "$__legorl_s" >/dev/null 2>&1\n'
    'eval "$__legorl_c"\n'
    "__legorl_rc=$?\n"
    'export -p > "$__legorl_s" 2>/dev/null\n'
    f'printf \'\\n{MARK}%s\\n%s\\n\' "$(pwd)" "$(command -v python 2>/dev/null)"\n'
    "exit $__legorl_rc\n"
)
_LAUNCH = 'if command -v bash >/dev/null 2>&1; then exec bash -c "$LEGORL_SCRIPT"; fi\nexec sh -c "$LEGORL_SCRIPT"'
# Prints what `path` is in the sandbox: "d" + the entries two levels deep ("d NAME" or
# "f NAME", each ended by a NUL: a name may hold a newline), "f MODE" for anything else
# that exists, or "n" + whether the parent exists.
_PROBE = (
    'p=$LEGORL_PATH\nif [ -d "$p" ]; then echo d; cd "$p" || exit 0\n'
    "find . -mindepth 1 -maxdepth 2 -type d -exec printf 'd %s\\0' {} +\n"
    "find . -mindepth 1 -maxdepth 2 ! -type d -exec printf 'f %s\\0' {} +\n"
    'elif [ -e "$p" ]; then echo "f $(stat -c %a "$p" 2>/dev/null || echo 644)"\n'
    'else if [ -d "$(dirname "$p")" ]; then echo "n 1"; else echo "n 0"; fi; fi'
)


def bind(call: Call) -> None:
    global _call
    _call = call


def open_rollout(rid: str, repo_dir: str, mirror: str, command_timeout_s: float) -> None:
    _rollouts[rid] = {"repo": repo_dir, "mirror": mirror, "timeout": command_timeout_s}


def close_rollout(rid: str) -> None:
    _rollouts.pop(rid, None)


def host(msg: dict[str, Any]) -> dict[str, Any]:
    if _call is None:
        raise RuntimeError("sandbox tools used outside the LEGO-RL warm OpenHands driver")
    return _call(msg)


def sandbox_exec(rid: str, command: str, cwd: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
    return host({"op": "exec", "id": rid, "command": command, "cwd": cwd, "env": env, "timeout": timeout})


class SandboxTerminalExecutor(ToolExecutor):
    """Runs the SDK's `TerminalAction`s in the rollout's sandbox (module docstring)."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.repo = _rollouts[rid]["repo"]
        self.default_timeout = float(_rollouts[rid]["timeout"])
        self.cwd = self.repo
        self.state = f"/tmp/.legorl-openhands-{rid[:16]}.sh"

    def __call__(self, action: Any, conversation: Any = None) -> TerminalObservation:  # noqa: ARG002
        if action.reset:
            self.cwd = self.repo
            sandbox_exec(self.rid, f"rm -f {self.state}", self.repo, {}, 10)
            return TerminalObservation.from_text(
                text=(
                    "Terminal session has been reset. All previous environment "
                    "variables and session state have been cleared."
                ),
                command="[RESET]",
                exit_code=0,
            )
        if action.is_input:
            return TerminalObservation.from_text(
                text="No previous running command to interact with.", command=action.command, is_error=True
            )
        if action.command.strip() == "":
            return TerminalObservation.from_text(
                text="No previous running command to retrieve logs from.", command=action.command, is_error=True
            )
        timeout = float(action.timeout) if action.timeout else self.default_timeout
        env = {"LEGORL_CMD": action.command, "LEGORL_STATE": self.state, "LEGORL_SCRIPT": _SCRIPT}
        reply = sandbox_exec(self.rid, _LAUNCH, self.cwd, env, timeout)
        if reply.get("error"):
            return TerminalObservation.from_text(
                text=f"The command could not run: {reply['error']}", command=action.command, is_error=True
            )
        out = str(reply.get("output", ""))
        meta = CmdOutputMetadata()
        head, sep, tail = out.rpartition(f"\n{MARK}")
        if sep:
            out = head
            cwd, _, py = tail.partition("\n")
            self.cwd = cwd or self.cwd
            meta.working_dir = self.cwd
            meta.py_interpreter_path = py.strip() or None
        if reply.get("timed_out"):
            meta.exit_code = -1
            meta.suffix = f"\n[The command timed out after {timeout:g} seconds. {TIMEOUT_MESSAGE_TEMPLATE}]"
            return TerminalObservation.from_text(
                text=out, command=action.command, exit_code=-1, timeout=True, metadata=meta
            )
        rc = int(reply.get("returncode", -1))
        meta.exit_code = rc
        meta.working_dir = self.cwd
        meta.suffix = f"\n[The command completed with exit code {rc}.]"
        return TerminalObservation.from_text(text=out, command=action.command, exit_code=rc, metadata=meta)


class SandboxFileEditorExecutor(ToolExecutor):
    """The SDK's `FileEditorExecutor` on a host mirror of the sandbox (module docstring)."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.repo = _rollouts[rid]["repo"]
        self.root = _rollouts[rid]["mirror"].rstrip("/")
        self.inner = FileEditorExecutor(workspace_root=self.root + self.repo)
        self.modes: dict[str, int] = {}

    def __call__(self, action: Any, conversation: Any = None) -> Any:  # noqa: ARG002
        try:
            return self._call(action)
        except (OSError, ValueError) as e:  # the mirror could not hold what the sandbox has
            return _error_observation(action.command, action.path, f"{type(e).__name__}: {e}")

    def _call(self, action: Any) -> Any:
        if not action.path.startswith("/"):  # the SDK's own answer to a relative path
            return self._unmirror(self.inner(action))
        path = posixpath.normpath(action.path)
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        error = self._pull(path)
        if error:
            return _error_observation(action.command, path, f"Could not read {path}: {error}")
        obs = self.inner(action.model_copy(update={"path": self.root + path}))
        if action.command != "view" and not obs.is_error:
            error = self._push(path)
            if error:
                return _error_observation(action.command, path, f"Could not write {path}: {error}")
        return self._unmirror(obs)

    def _pull(self, path: str) -> str:
        """Make the mirror of `path` what the sandbox holds; an error text, or ""."""
        reply = sandbox_exec(self.rid, _PROBE, "/", {"LEGORL_PATH": path}, 30)
        if reply.get("error"):
            return str(reply["error"])
        head, _, entries = str(reply.get("output", "")).partition("\n")
        kind, _, arg = (head or "n 0").partition(" ")
        local = self.root + path
        if os.path.isdir(local) and not os.path.islink(local):
            shutil.rmtree(local)
        elif os.path.lexists(local):
            os.unlink(local)
        if kind == "d":
            os.makedirs(local, exist_ok=True)
            for record in filter(None, entries.split("\0")):
                t, _, rel = record.partition(" ")
                entry = os.path.realpath(os.path.join(local, rel))
                if not entry.startswith(local.rstrip("/") + "/"):  # never outside the mirror
                    continue
                if t == "d":
                    os.makedirs(entry, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(entry), exist_ok=True)
                    open(entry, "wb").close()
        elif kind == "f":
            reply = host({"op": "read", "id": self.rid, "path": path})
            if reply.get("error"):
                return str(reply["error"])
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "wb") as f:
                f.write(base64.b64decode(reply["data"]))
            self.modes[path] = int(arg or "644", 8)
        elif arg == "1":  # missing, in an existing directory: `create` may make it
            os.makedirs(os.path.dirname(local), exist_ok=True)
        return ""

    def _push(self, path: str) -> str:
        with open(self.root + path, "rb") as f:
            data = base64.b64encode(f.read()).decode()
        mode = self.modes.get(path, 0o644)
        reply = host({"op": "write", "id": self.rid, "path": path, "data": data, "mode": mode})
        return str(reply.get("error") or "")

    def _unmirror(self, obs: Any) -> Any:
        """The observation with every mention of the mirror's location removed."""
        fix = self._strip
        content = [TextContent(text=fix(c.text)) if isinstance(c, TextContent) else c for c in obs.content]
        update: dict[str, Any] = {"content": content}
        if getattr(obs, "path", None):
            update["path"] = fix(obs.path)
        return obs.model_copy(update=update)

    def _strip(self, text: str) -> str:
        return text.replace(self.root + "/", "/").replace(self.root, "/")


def _error_observation(command: str, path: str, text: str) -> Any:
    from openhands.tools.file_editor.definition import FileEditorObservation

    return FileEditorObservation.from_text(text=text, command=command, path=path, is_error=True)


class SandboxTerminal(TerminalTool):
    """Resolves to the SDK's `TerminalTool`, executed in the rollout's sandbox."""

    name = "legorl_sandbox_terminal"  # the registry key; the tool the model sees is `terminal`

    @classmethod
    def create(cls, conv_state: Any, rollout_id: str = "", **_: Any) -> Sequence[TerminalTool]:
        return TerminalTool.create(conv_state, executor=SandboxTerminalExecutor(rollout_id))


class SandboxFileEditor(FileEditorTool):
    """Resolves to the SDK's `FileEditorTool`, its edits made in the rollout's sandbox."""

    name = "legorl_sandbox_file_editor"

    @classmethod
    def create(cls, conv_state: Any, rollout_id: str = "", **_: Any) -> Sequence[FileEditorTool]:
        # The SDK's definition names the (mirror's) working directory in its description:
        # the model is told the sandbox's, as the in-sandbox harness tells it.
        ex = SandboxFileEditorExecutor(rollout_id)
        return [
            t.set_executor(ex).model_copy(update={"description": ex._strip(t.description)})
            for t in FileEditorTool.create(conv_state)
        ]


register_tool(SandboxTerminal.name, SandboxTerminal)
register_tool(SandboxFileEditor.name, SandboxFileEditor)
