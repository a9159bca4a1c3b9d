"""Runs one OpenHands SDK agent headless; executed INSIDE the sandbox by the OpenHands venv.

The OpenHands "harness" is a Python SDK, not a CLI, so this small script is its command
line: it builds the SDK's standard agent (terminal, file editor and task tracker tools,
plus the built-in `finish` and `think`; the default summarising condenser, its size
configurable so that tests can force a condensation) pointed at the proxy session, runs
one conversation on the task, and writes what happened as JSON. It configures and
launches only; nothing of the SDK is patched. It must stay importable without `legorl`
(it runs on the harness's own Python 3.12, which does not have the project installed).

    python openhands_driver.py --base-url URL --model NAME --api-key KEY --workspace DIR \
        --prompt-file FILE --out RESULT.json [--max-iterations N] [--condenser-max-size N]

Where this runs (the rule for every `in_sandbox/` folder of the project): inside the agent's
sandbox, on the harness layer's interpreter. The adapter (`openhands.py`) reads this file
by path and writes it into the sandbox; the host never imports it. The warm driver
(`in_driver/openhands_warm_driver/driver.py`) loads it by path too, for `parser` and `run`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

T_START = time.time()  # the interpreter is up (its own start-up is before this)


def parser() -> argparse.ArgumentParser:
    """The driver's options (the warm driver builds each job's options with it too)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True, help="OpenAI-compatible base URL ending in /v1")
    ap.add_argument("--model", required=True, help="model name sent to the proxy")
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--prompt-file", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-iterations", type=int, default=30)
    ap.add_argument("--condenser-max-size", type=int, default=0, help="0: the SDK's default condenser")
    ap.add_argument("--condenser-keep-first", type=int, default=2)
    ap.add_argument("--timeout-s", type=int, default=600, help="per LLM call")
    ap.add_argument("--num-retries", type=int, default=2)
    ap.add_argument("--terminal-type", default="subprocess", choices=["subprocess", "tmux"])
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    result: dict = {
        "status": "not_started",
        "error": None,
        "error_code": None,
        "final": "",
        "events": 0,
        "actions": 0,
        "condensations": 0,
        "llm_errors": [],
    }
    t0 = time.time()
    try:
        result.update(run(args))
    except Exception as e:  # noqa: BLE001 - report every failure as data, the adapter classifies it
        result["status"] = "crashed"
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc()[-4000:]
    result["wall_s"] = round(time.time() - t0, 2)
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(json.dumps({k: result[k] for k in ("status", "error_code", "events", "actions")}))
    return 0 if result["status"] != "crashed" else 3


def default_tools(args: argparse.Namespace) -> list:
    """The SDK's standard tools, run where this process runs (inside the sandbox)."""
    from openhands.sdk import Tool
    from openhands.tools.file_editor import FileEditorTool
    from openhands.tools.task_tracker import TaskTrackerTool
    from openhands.tools.terminal import TerminalTool

    return [
        Tool(name=TerminalTool.name, params={"terminal_type": args.terminal_type}),
        Tool(name=FileEditorTool.name),
        Tool(name=TaskTrackerTool.name),
    ]


def run(args: argparse.Namespace, tools: list | None = None, workspace: str | None = None, on_start=None) -> dict:
    """One conversation on the task. `tools` (Tool specs) and `workspace` default to the SDK's
    own tools in `args.workspace`; the warm driver passes its sandbox-backed ones, and
    `on_start(conversation)` to be able to pause it."""
    from openhands.sdk import LLM, Agent, Conversation
    from openhands.sdk.context.condenser import LLMSummarizingCondenser
    from openhands.sdk.conversation.response_utils import get_agent_final_response
    from openhands.sdk.event import ActionEvent, Condensation
    from openhands.sdk.event.conversation_error import ConversationErrorEvent
    from openhands.tools.preset.default import get_default_condenser

    t_imported = time.time()  # where OpenHands' start-up goes: the SDK's import dominates it

    llm = LLM(
        model=f"openai/{args.model}",
        base_url=args.base_url,
        api_key=args.api_key,
        usage_id="agent",
        num_retries=args.num_retries,
        retry_min_wait=1,
        retry_max_wait=4,
        timeout=args.timeout_s,
    )
    condenser_llm = llm.model_copy(update={"usage_id": "condenser"})
    if args.condenser_max_size > 0:
        condenser = LLMSummarizingCondenser(
            llm=condenser_llm, max_size=args.condenser_max_size, keep_first=args.condenser_keep_first
        )
    else:
        condenser = get_default_condenser(condenser_llm)
    agent = Agent(
        llm=llm,
        tools=tools if tools is not None else default_tools(args),
        system_prompt_kwargs={"cli_mode": True},
        condenser=condenser,
    )
    counts = {"events": 0, "actions": 0, "condensations": 0}
    errors: list[dict] = []

    def on_event(ev: object) -> None:
        counts["events"] += 1
        if isinstance(ev, ActionEvent):
            counts["actions"] += 1
        elif isinstance(ev, Condensation):
            counts["condensations"] += 1
        elif isinstance(ev, ConversationErrorEvent):
            errors.append({"code": ev.code, "detail": str(ev.detail)[:2000]})

    conv = Conversation(
        agent=agent,
        workspace=workspace or args.workspace,
        max_iteration_per_run=args.max_iterations,
        visualizer=None,
        callbacks=[on_event],
    )
    if on_start is not None:
        on_start(conv)
    if getattr(args, "prompt", None) is not None:
        conv.send_message(args.prompt)
    else:
        with open(args.prompt_file) as f:
            conv.send_message(f.read())
    phases = {"import_s": round(t_imported - T_START, 2), "setup_s": round(time.time() - t_imported, 2)}
    try:
        conv.run()
    finally:
        status = str(getattr(conv.state.execution_status, "value", conv.state.execution_status))
    final = get_agent_final_response(conv.state.events) or ""
    out = {"status": status, "final": final[:4000], **counts, "llm_errors": errors, "startup": phases}
    if errors:
        out["error_code"] = errors[-1]["code"]
        out["error"] = errors[-1]["detail"]
    conv.close()
    return out


if __name__ == "__main__":
    # The script's own directory comes first on sys.path; in the source tree it holds the
    # adapter module `openhands.py`, which would shadow the SDK package of the same name.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
    sys.exit(main())
