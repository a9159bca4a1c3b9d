"""The warm mini-swe-agent driver: one long-lived process that runs many rollouts.

Run with the mini-swe-agent layer's interpreter (its own venv), not the project's: it
imports only mini-swe-agent (and, through it, LiteLLM) and the standard library.
Importing LiteLLM costs seconds of CPU, and a rollout's agent loop only milliseconds, so
one process serves every rollout of a worker, each in a thread: mini-swe-agent's own
`DefaultAgent` and model (`get_model`), and its environment extension point
(`get_environment`) with `legorl_sandbox_env.SandboxEnvironment`, so every command runs
in that rollout's sandbox — exactly how its batch runner (`mini-extra swebench`) builds
agents in threads with a per-instance environment.

Where this runs: in the harness layer's own interpreter, started by path, never imported
by the host (the `in_driver/` rule: `../warm_driver_lib/warm_protocol.py`).

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

import os
import sys
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "warm_driver_lib")]
import warm_protocol  # noqa: E402  (first: the protocol takes the real stdout before the harness is imported)

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
_configs: dict[str, dict[str, Any]] = {}


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
            "api_key": job.get("api_key") or "legorl",  # the run's proxy secret
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
    except (Exception, SystemExit) as e:  # noqa: BLE001 - what the agent re-raises (API errors) is reported
        # (SystemExit too: a thread that ends without "done" leaves the host waiting until its timeout)
        out.update(exit_status=type(e).__name__, error="".join(traceback.format_exception_only(e))[-2000:])
    warm_protocol.write(out)


def main() -> None:
    legorl_sandbox_env.bind(warm_protocol.request)
    warm_protocol.serve(run_one, threads_env="LEGORL_MINI_THREADS")


if __name__ == "__main__":
    main()
