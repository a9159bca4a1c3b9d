"""The warm OpenHands driver: one long-lived SDK process that runs many rollouts.

Run with the openhands layer's interpreter (its own venv), not the project's. Importing
the SDK costs ~5 CPU-s (LiteLLM, the SDK's and ACP's pydantic models), a rollout's own
work a fraction of that, so one process serves every rollout of a worker, each
conversation in a thread: the same agent `openhands_driver.run` builds for the in-sandbox
adapter (the SDK's standard agent and condenser), with the SDK's terminal and file editor
resolved through `sandbox_tools` (registered tools whose execution happens in that
rollout's sandbox) and the SDK's own task tracker, `finish` and `think`.

Where this runs: in the harness layer's own interpreter, started by path, never imported
by the host (the `in_driver/` rule: `../warm_driver_lib/warm_protocol.py`).

Protocol, one JSON object per line:

    stdin  {"op": "run", "id": R, "argv": [driver options...], "task": "...", "cwd": "/repo",
            "command_timeout_s": 120}
           {"op": "cancel", "id": R}                       pause R's conversation (our timeout)
           {"op": "result", "n": N, ...}                   the reply to a request below
    stdout {"op": "ready", "import_s": 4.1}                once, after the imports
           {"op": "exec", "n": N, "id": R, "command": ..., "cwd": ..., "env": {...}, "timeout": 10}
           {"op": "read", "n": N, "id": R, "path": P}      → {"data": base64} | {"error": ...}
           {"op": "write", "n": N, "id": R, "path": P, "data": base64, "mode": 420}
           {"op": "done", "id": R, "result": {...}}        what openhands_driver writes as JSON
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "warm_driver_lib")]
import warm_protocol  # noqa: E402  (first: the protocol takes the real stdout before the SDK is imported)

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")


def _load_driver() -> Any:
    """The in-sandbox driver, `legorl/harness/in_sandbox/openhands_driver.py`: loaded by path,
    not through sys.path (its folder's parent holds the adapter module `openhands.py`, which
    must not shadow the SDK package)."""
    path = os.path.join(HERE, "..", "..", "in_sandbox", "openhands_driver.py")
    spec = importlib.util.spec_from_file_location("openhands_driver", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


oh = _load_driver()
import sandbox_tools  # noqa: E402  (imports the SDK: the cost paid once per worker)
from openhands.sdk import Tool  # noqa: E402
from openhands.sdk.context.condenser import LLMSummarizingCondenser  # noqa: E402, F401  (warm the imports run() makes)
from openhands.sdk.conversation.response_utils import get_agent_final_response  # noqa: E402, F401
from openhands.tools.preset.default import get_default_condenser  # noqa: E402, F401
from openhands.tools.task_tracker import TaskTrackerTool  # noqa: E402

_conversations: dict[str, Any] = {}
_cancelled: set[str] = set()


def _started(rid: str, conv: Any) -> None:
    _conversations[rid] = conv
    if rid in _cancelled:
        conv.pause()


def run_one(job: dict[str, Any]) -> None:
    rid = job["id"]
    result: dict[str, Any] = {"status": "not_started", "error": None, "error_code": None}
    mirror = tempfile.mkdtemp(prefix="legorl-openhands-mirror-")
    t0 = time.time()
    try:
        args = oh.parser().parse_args(job["argv"])
        args.prompt = job["task"]
        workspace = mirror + job["cwd"]
        os.makedirs(workspace, exist_ok=True)
        sandbox_tools.open_rollout(rid, job["cwd"], mirror, float(job.get("command_timeout_s") or 120))
        tools = [
            Tool(name=sandbox_tools.SandboxTerminal.name, params={"rollout_id": rid}),
            Tool(name=sandbox_tools.SandboxFileEditor.name, params={"rollout_id": rid}),
            Tool(name=TaskTrackerTool.name),
        ]
        result.update(oh.run(args, tools=tools, workspace=workspace, on_start=lambda c: _started(rid, c)))
        result["startup"]["import_s"] = 0.0  # paid once, by the driver (its "ready" message)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - every failure is data; the host classifies it
        # SystemExit too: argparse exits on options it cannot read, and a thread that ends
        # without "done" leaves the host waiting for this rollout until its timeout
        result["status"] = "crashed"
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()[-4000:]
    finally:
        sandbox_tools.close_rollout(rid)
        _conversations.pop(rid, None)
        _cancelled.discard(rid)
        shutil.rmtree(mirror, ignore_errors=True)
    result["wall_s"] = round(time.time() - t0, 2)
    warm_protocol.write({"op": "done", "id": rid, "result": result})


def _cancel(rid: str) -> None:
    _cancelled.add(rid)
    conv = _conversations.get(rid)
    if conv is not None:  # not on the protocol loop: pause() waits for the step in progress,
        # which may be waiting for a reply that only that loop can deliver
        threading.Thread(target=conv.pause, daemon=True).start()


def main() -> None:
    sandbox_tools.bind(warm_protocol.call)
    ready = {"import_s": round(time.time() - T0, 2)}
    warm_protocol.serve(run_one, ready=ready, on_cancel=_cancel, threads_env="LEGORL_OPENHANDS_THREADS")


if __name__ == "__main__":
    main()
