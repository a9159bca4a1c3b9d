"""Quickstart episodes run by the real mini-swe-agent, through the real proxy.

`HarnessRunner` owns three things for a whole run: an in-process `ProxyServer` (HTTP on
loopback, OpenAI chat dialect, recording every `Turn` with the ids the engine saw and
produced), one long-lived mini-swe-agent worker process (`mini_worker.py`, in the
harness's own venv) and a directory per episode where the agent's commands run. For each
batch it opens one proxy session per episode, hands the batch to the worker (one agent
thread per episode, each pointed at its session's `/s/<id>/v1`), waits for every agent to
exit, closes the sessions (their turns are the token-exact record) and grades each
episode in a fresh directory. The engine behind the proxy is swapped per batch: the
scripted expert for SFT data, the `hf` engine holding the current policy for evaluation.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Self

from legorl.engine.base import Engine
from legorl.proxy.config import ProxyConfig
from legorl.proxy.render import Renderer
from legorl.proxy.server import ProxyServer
from legorl.quickstart.dialogue import CONFIG_PATH
from legorl.quickstart.family import PROBLEM, QuickTask
from legorl.quickstart.workspace import DirWorkspace, outcome_of
from legorl.types import Outcome, Turn

WORKER = Path(__file__).resolve().with_name("mini_worker.py")
MODEL = "openai/legorl-policy"


class HarnessUnavailable(RuntimeError):
    """mini-swe-agent is not installed (see scripts/setup_harnesses.sh)."""


def mini_python() -> Path:
    """The interpreter of the installed mini-swe-agent layer."""
    from legorl.harness.install import HarnessNotInstalled, require

    try:
        layer = require("mini-swe-agent")
    except HarnessNotInstalled as e:
        raise HarnessUnavailable(str(e)) from None
    py = Path(layer) / "venv" / "bin" / "python"
    if not py.exists():
        raise HarnessUnavailable(f"mini-swe-agent layer at {layer} has no venv/bin/python")
    return py


class HarnessEpisode:
    """One real-harness episode: its recorded turns, the agent's exit and the grade."""

    def __init__(self, task: QuickTask, session_id: str) -> None:
        self.task = task
        self.session_id = session_id
        self.turns: list[Turn] = []
        self.exit_status = ""
        self.error = ""
        self.outcome: Outcome | None = None

    @property
    def resolved(self) -> bool:
        return self.outcome is not None and self.outcome.reward > 0


class HarnessRunner:
    """Proxy + mini-swe-agent worker for a run (an async context manager)."""

    def __init__(
        self, renderer: Renderer, engine: Engine, work_root: Path, env: dict[str, str], *,
        proxy_cfg: ProxyConfig | None = None, threads: int = 32, config_path: Path = CONFIG_PATH,
        batch_timeout_s: float = 600.0,
    ) -> None:  # fmt: skip
        self.renderer = renderer
        self.engine = engine
        self.work_root = work_root
        self.env = env
        self.proxy_cfg = proxy_cfg or ProxyConfig()
        self.threads = threads
        self.config_path = config_path
        self.batch_timeout_s = batch_timeout_s
        self.server: ProxyServer | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.log_path = work_root / "mini_worker.log"

    async def __aenter__(self) -> Self:
        python = mini_python()
        self.server = ProxyServer(self.proxy_cfg, self.engine, self.renderer)
        await self.server.start()
        wenv = {**self.env, "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2", "PYTHONDONTWRITEBYTECODE": "1",
                "MSWEA_GLOBAL_CONFIG_DIR": str(self.work_root / "mini-config"), "HOME": str(self.work_root)}
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                str(python), str(WORKER), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=log_fd, env=wenv, limit=1 << 24,
            )  # fmt: skip
        finally:
            os.close(log_fd)  # the child holds its own copy
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.server is not None:
            await self.server.stop()

    async def run(self, tasks: list[QuickTask], engine: Engine | None = None, *, step: int = 0) -> list[HarnessEpisode]:
        """Run one episode per task with `engine` behind the proxy; graded episodes, in order."""
        assert self.server is not None and self.proc is not None and self.proc.stdin and self.proc.stdout
        if engine is not None:
            self.server.ctx.engine = engine
        episodes, spaces, lines = [], {}, []
        for task in tasks:
            sid = f"qs-{step}-{uuid.uuid4().hex[:10]}"
            self.server.open_session(sid, {"instance_id": task.instance_id, "step": step})
            ws = DirWorkspace(task, self.work_root, self.env)
            episodes.append(HarnessEpisode(task, sid))
            spaces[sid] = ws
            lines.append({"id": sid, "api_base": f"{self.server.session_url(sid)}/v1", "cwd": str(ws.dir), "task": PROBLEM})
        batch = {"config": str(self.config_path), "model": MODEL, "threads": self.threads, "episodes": lines}
        self.proc.stdin.write((json.dumps(batch) + "\n").encode())
        await self.proc.stdin.drain()
        results: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + self.batch_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                raw = await asyncio.wait_for(self.proc.stdout.readline(), max(remaining, 0.001))
            except TimeoutError:
                raise RuntimeError(
                    f"mini-swe-agent did not finish {len(tasks)} episodes in {self.batch_timeout_s:g} s "
                    f"({len(results)} done; see {self.log_path})"
                ) from None
            if not raw:
                raise RuntimeError(f"mini-swe-agent worker exited (see {self.log_path})")
            msg = json.loads(raw)
            if "batch_done" in msg:
                break
            results[msg["id"]] = msg
        for ep in episodes:
            res = results.get(ep.session_id, {})
            ep.exit_status, ep.error = res.get("exit_status", ""), res.get("error", "")
            ep.turns = self.server.close_session(ep.session_id)
        outcomes = await asyncio.gather(
            *(asyncio.to_thread(outcome_of, ep.exit_status, spaces[ep.session_id], ep.error) for ep in episodes)
        )
        for ep, outcome in zip(episodes, outcomes, strict=True):
            ep.outcome = outcome
            spaces[ep.session_id].close()
        return episodes

