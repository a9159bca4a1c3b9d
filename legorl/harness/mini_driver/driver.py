"""The warm mini-swe-agent driver: one long-lived process that runs many rollouts.

Run with the mini-swe-agent layer's interpreter (its own venv), not the project's: it
imports only mini-swe-agent (and, through it, LiteLLM) and the standard library.
Importing LiteLLM costs seconds of CPU, and a rollout's agent loop only milliseconds, so
one process serves every rollout of a worker, each in a thread: mini-swe-agent's own
`DefaultAgent` and model (`get_model`), and its environment extension point
(`get_environment`) with `legorl_sandbox_env.SandboxEnvironment`, so every command runs
in that rollout's sandbox — exactly how its batch runner (`mini-extra swebench`) builds
agents in threads with a per-instance environment.

Protocol, one JSON object per line:

    stdin  {"op": "run", "id": R, "config": YAML, "model": "openai/legorl-policy",
            "api_base": "http://127.0.0.1:PORT/s/SESSION/v1", "task": "...", "cwd": "/repo",
            "overrides": {"agent": {...}, "environment": {...}, "model": {...}}}
           {"op": "result", "n": N, "output": "...", "returncode": 0, "timed_out": false}
           {"op": "result", "n": N, "error": "sandbox closed"}
    stdout {"op": "ready"}                                 once, after the imports
           {"op": "exec", "n": N, "id": R, "command": ..., "cwd": ..., "env": {...}, "timeout": 10}
           {"op": "done", "id": R, "exit_status": "Submitted", "n_calls": 2, "error": ""}
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# The protocol owns the real stdout; anything LiteLLM or mini-swe-agent prints goes to stderr.
PROTOCOL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_CONFIGURED", "true")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import legorl_sandbox_env  # noqa: E402
import yaml  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments import get_environment  # noqa: E402
from minisweagent.models import get_model  # noqa: E402

ENV_CLASS = "legorl_sandbox_env.SandboxEnvironment"
_out_lock = threading.Lock()
_pending: dict[int, queue.Queue] = {}
_counter = itertools.count(1)
_configs: dict[str, dict[str, Any]] = {}


def write(msg: dict[str, Any]) -> None:
    line = json.dumps(msg) + "\n"
    with _out_lock:
        PROTOCOL.write(line)
        PROTOCOL.flush()


def send(msg: dict[str, Any]) -> queue.Queue:
    """Send a request to the host; the reply arrives on the returned queue."""
    n = next(_counter)
    box: queue.Queue = queue.Queue(maxsize=1)
    _pending[n] = box
    write({**msg, "n": n})
    return box


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def config(path: str) -> dict[str, Any]:
    if path not in _configs:
        with open(path) as f:
            cfg = yaml.safe_load(f) or {}
        cfg.setdefault("agent", {}).pop("mode", None)
        _configs[path] = cfg
    return _configs[path]


def run_one(job: dict[str, Any]) -> None:
    out = {"op": "done", "id": job["id"], "exit_status": "", "n_calls": 0, "submission": "", "error": ""}
    try:
        cfg = _merge(config(job["config"]), job.get("overrides") or {})
        model_cfg = dict(cfg.get("model", {}))
        model_cfg["model_kwargs"] = {
            **model_cfg.get("model_kwargs", {}),
            "api_base": job["api_base"],
            "api_key": "legorl",
        }
        model = get_model(job["model"], model_cfg)
        env_cfg = {
            **cfg.get("environment", {}),
            "environment_class": ENV_CLASS,
            "cwd": job["cwd"],
            "rollout_id": job["id"],
        }
        env = get_environment(env_cfg)
        agent = DefaultAgent(model, env, **cfg.get("agent", {}))
        result = agent.run(job["task"])
        out.update(exit_status=result.get("exit_status", ""), submission=result.get("submission", ""))
        out["n_calls"] = agent.n_calls
    except Exception as e:  # noqa: BLE001 - what the agent re-raises (API errors) is reported
        out.update(exit_status=type(e).__name__, error="".join(traceback.format_exception_only(e))[-2000:])
    write(out)


def main() -> None:
    legorl_sandbox_env.bind(send)
    pool = ThreadPoolExecutor(max_workers=int(os.environ.get("LEGORL_MINI_THREADS", "256")))
    write({"op": "ready"})
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if msg["op"] == "run":
            pool.submit(run_one, msg)
        elif msg["op"] == "result":
            box = _pending.pop(int(msg["n"]), None)
            if box is not None:
                box.put(msg)
    # stdin closed: the host is gone or done; unblock every waiting command and leave
    for box in list(_pending.values()):
        box.put({"error": "the LEGO-RL host closed the driver"})
    pool.shutdown(wait=False, cancel_futures=True)
    os._exit(0)


if __name__ == "__main__":
    main()
