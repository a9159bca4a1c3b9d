"""mini-swe-agent environment whose commands run in a LEGO-RL sandbox (the harness's own
extension point: `environment_class: legorl_sandbox_env.SandboxEnvironment`).

Runs inside mini-swe-agent's venv, in the warm driver process (`driver.py`); imports only
mini-swe-agent and the standard library. It subclasses mini-swe-agent's own
`LocalEnvironment` and replaces only *where* a command runs: instead of a subprocess on
this machine, `execute` asks the LEGO-RL host (over the driver's stdin/stdout protocol) to
run it with `/bin/sh` in this rollout's sandbox, stdout and stderr merged, the sandbox's
process tree killed at the timeout — the same observable behaviour as
`LocalEnvironment._run` — and then calls the harness's own `_check_finished`, so
submission, output and error texts are mini-swe-agent's.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from minisweagent.environments.local import LocalEnvironment, LocalEnvironmentConfig

# The driver installs the function that sends one request to the host and returns the
# queue the reply will arrive on (`bind`); one environment per rollout.
_send: Callable[[dict[str, Any]], queue.Queue] | None = None


def bind(send: Callable[[dict[str, Any]], queue.Queue]) -> None:
    global _send
    _send = send


class SandboxEnvironmentConfig(LocalEnvironmentConfig):
    rollout_id: str = ""
    """Which rollout's sandbox the commands run in (set by the driver)."""


class SandboxEnvironment(LocalEnvironment):
    def __init__(self, *, config_class: type = SandboxEnvironmentConfig, **kwargs: Any) -> None:
        super().__init__(config_class=config_class, **kwargs)

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        if _send is None:
            raise RuntimeError("SandboxEnvironment used outside the LEGO-RL warm driver")
        reply = _send(
            {
                "op": "exec",
                "id": self.config.rollout_id,
                "command": command,
                "cwd": cwd or self.config.cwd,
                "env": self.config.env,
                "timeout": limit,
            }
        ).get()
        if reply.get("error"):
            # the sandbox is gone (the rollout ended or the machinery failed): as an
            # exception, like a subprocess that cannot be started
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {reply['error']}",
                "extra": {"exception_type": "SandboxError", "exception": reply["error"]},
            }
        elif reply.get("timed_out"):
            msg = f"Command '{command}' timed out after {limit} seconds"  # subprocess.TimeoutExpired's text
            output = {
                "output": reply.get("output", ""),
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {msg}",
                "extra": {"exception_type": "TimeoutExpired", "exception": msg},
            }
        else:
            output = {"output": reply.get("output", ""), "returncode": int(reply["returncode"]), "exception_info": ""}
        self._check_finished(output)
        return output
