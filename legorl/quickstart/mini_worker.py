"""A long-lived mini-swe-agent process that runs many quickstart episodes (its own venv).

Run with the mini-swe-agent layer's interpreter, not the project's: it imports only
mini-swe-agent (and, through it, LiteLLM) and the standard library. Importing LiteLLM
costs seconds of CPU, so one process serves every episode of a run: it reads one JSON
batch per stdin line, runs the batch's episodes in threads — mini-swe-agent's own
`DefaultAgent` with its `litellm_textbased` model and `LocalEnvironment`, configured by
`mini_quickstart.yaml`, exactly as its `mini` CLI builds them, pointed at one proxy
session each — and writes one JSON line per finished episode, then `{"batch_done": n}`.

    stdin : {"config": YAML, "model": "openai/legorl-policy", "threads": 32,
             "episodes": [{"id": "s1", "api_base": "http://127.0.0.1:PORT/s/s1/v1",
                           "cwd": "/tmp/ep/s1", "task": "..."}, ...]}
    stdout: {"id": "s1", "exit_status": "Submitted", "n_calls": 2, "submission": "",
             "error": ""}

mini-swe-agent's batch runner (`mini-extra swebench`) runs agents in threads the same way.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor

# The protocol owns the real stdout; anything LiteLLM or mini-swe-agent prints goes to stderr.
PROTOCOL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_CONFIGURED", "true")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models import get_model


def run_one(cfg: dict, model_name: str, ep: dict) -> dict:
    model_cfg = dict(cfg.get("model", {}))
    model_cfg["model_kwargs"] = {**model_cfg.get("model_kwargs", {}), "api_base": ep["api_base"], "api_key": "legorl"}
    out = {"id": ep["id"], "exit_status": "", "n_calls": 0, "submission": "", "error": ""}
    try:
        model = get_model(model_name, model_cfg)
        env = LocalEnvironment(**{**cfg.get("environment", {}), "cwd": ep["cwd"]})
        agent = DefaultAgent(model, env, **cfg.get("agent", {}))
        result = agent.run(ep["task"])
        out.update(exit_status=result.get("exit_status", ""), submission=result.get("submission", ""))
        out["n_calls"] = agent.n_calls
    except Exception as e:  # noqa: BLE001 - the agent re-raises what it cannot handle (API errors): reported
        out.update(exit_status=type(e).__name__, error="".join(traceback.format_exception_only(e))[-2000:])
    return out


def main() -> None:
    lock_out = PROTOCOL
    for line in sys.stdin:
        if not line.strip():
            continue
        batch = json.loads(line)
        with open(batch["config"]) as f:
            cfg = yaml.safe_load(f)
        cfg.setdefault("agent", {}).pop("mode", None)
        episodes = batch["episodes"]
        with ThreadPoolExecutor(max_workers=max(1, int(batch.get("threads", 16)))) as pool:
            for res in pool.map(functools.partial(run_one, cfg, batch["model"]), episodes):
                lock_out.write(json.dumps(res) + "\n")
                lock_out.flush()
        lock_out.write(json.dumps({"batch_done": len(episodes)}) + "\n")
        lock_out.flush()


if __name__ == "__main__":
    main()
