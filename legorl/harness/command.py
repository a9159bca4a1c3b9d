"""The `command` harness: a given shell script is the agent.

It is the smallest honest harness: what a scripted agent, a baseline or a reward-hacking
test needs. The script runs in the agent sandbox with the repository root as its working
directory, the problem statement in a file, and, when a proxy session exists, the usual
variables pointing API clients at the sandbox's forwarded loopback URL of that session:

    OPENAI_BASE_URL=http://127.0.0.1:<port>/v1     ANTHROPIC_BASE_URL=http://127.0.0.1:<port>
    OPENAI_API_KEY / ANTHROPIC_API_KEY=legorl      (clients insist on a key; the proxy ignores it)
    LEGORL_PROBLEM_FILE=/tmp/.legorl-agent/problem.md
    LEGORL_INSTANCE_ID, LEGORL_BASE_COMMIT, LEGORL_REPO

Like every harness adapter it is a `Harness` (`legorl/harness/base.py`):
`run(sb, task, proxy_url, repo_dir, timeout_s)` → `AgentRun`. How the run ended is evidence
for the rollout (`legorl/rollout.py`), which decides the status.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from legorl.harness.actions import TOOL_CALLS, ActionFormat
from legorl.harness.base import AGENT_DIR, AgentRun
from legorl.sandbox.base import Sandbox
from legorl.types import Task


def proxy_env(proxy_url: str | None) -> dict[str, str]:
    """Variables that point OpenAI- and Anthropic-style clients at the proxy session."""
    if not proxy_url:
        return {}
    base = proxy_url.rstrip("/")
    return {
        "OPENAI_BASE_URL": f"{base}/v1",
        "OPENAI_API_BASE": f"{base}/v1",
        "OPENAI_API_KEY": "legorl",
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_API_KEY": "legorl",
    }


@dataclass(frozen=True)
class CommandHarness:
    """Run `script` (bash) as the agent."""

    script: str
    name: str = "command"
    # a script's model calls: the dialect's tool calls, if any
    action_format: ClassVar[ActionFormat] = TOOL_CALLS
    shell: str = "bash"

    @classmethod
    def from_file(cls, path: str | Path) -> CommandHarness:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"command file {p} does not exist")
        return cls(script=p.read_text())

    def env(self, task: Task, proxy_url: str | None, repo_dir: str) -> dict[str, str]:
        return {
            **proxy_env(proxy_url),
            "LEGORL_PROBLEM_FILE": f"{AGENT_DIR}/problem.md",
            "LEGORL_INSTANCE_ID": task.instance_id,
            "LEGORL_BASE_COMMIT": task.base_commit,
            "LEGORL_REPO": repo_dir,
        }

    async def run(self, sb: Sandbox, task: Task, proxy_url: str | None, repo_dir: str, timeout_s: float) -> AgentRun:
        await sb.exec(f"mkdir -p {AGENT_DIR}", timeout_s=30)
        await sb.write_file(f"{AGENT_DIR}/problem.md", task.problem_statement.encode())
        await sb.write_file(f"{AGENT_DIR}/agent.sh", self.script.encode(), mode=0o755)
        res = await sb.exec(
            f"exec {shlex.quote(self.shell)} {AGENT_DIR}/agent.sh",
            timeout_s=timeout_s,
            cwd=repo_dir,
            env=self.env(task, proxy_url, repo_dir),
        )
        return AgentRun(
            exit_code=res.exit_code,
            timed_out=res.timed_out,
            resource_exhausted=res.resource_exhausted,
            duration_s=res.duration_s,
            stdout_tail=res.stdout[-4000:],
            stderr_tail=res.stderr[-4000:],
        )
