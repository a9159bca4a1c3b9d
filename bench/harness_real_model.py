"""Every harness serves a real model: `legorl eval` with SmolLM2-135M-Instruct through each
of the eight harness programs and both warm drivers, and one table of how their turns went.

For each harness this writes a run config (the `hf` engine on SmolLM2, rendered by its own
chat template; local sandboxes; the shipped tasks; `[harness] max_turns`; the proxy's
`max_tokens` cap) and runs the real command line, `legorl eval CONFIG --limit N --out F`,
in its own process, one harness after another so that each has the two cores to itself.
From each evaluation's JSON it reports, per harness:
- `action_share`: the share of the policy's turns that held an action the harness could
  take (a tool call in the harness's dialect, or the one command block mini-swe-agent reads);
  `parse_share`: the share it could read at all (an action or a final answer);
- `prompt_tokens` and `seconds` per turn (request to last token, as the proxy saw it);
- the outcomes (`status_counts`), and how many rollouts the proxy's context error ended
  (`context_exceeded`: the harness's own prompt, or its conversation, does not fit the
  model's 8,192-token window) or whose harness exited before its first model call
  (`exited_before_first_call`, with the harness's last output as the hint);
- `no_5xx`: no request of any rollout was answered with a 5xx (the proxy counts every 5xx
  it answers on the request's session, and the loop turns such a rollout into an
  infrastructure outcome, masked: so it is read from the outcomes); `no_infra`: no
  infrastructure outcome of any cause (a sandbox that would not start, too);
  `delivered_fraction`: the smallest share of a rollout's sampled tokens found at its
  trained positions (must be 1.0).
A 135M model resolves none of these tasks: the figures are what a real model's output does
to each harness, not a pass rate. Prints one JSON object.

    .venv/bin/python bench/harness_real_model.py [--harness NAME ...] [--tasks 5] [--max-turns 4] [--out DIR]

CPU prefill of a long harness prompt costs minutes per turn on two cores: run it on an idle
machine and say so when quoting it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from legorl.harness.registry import HARNESSES  # noqa: E402

MODEL = "smollm2-135m-instruct"
WINDOW = 8192  # SmolLM2-135M's max_position_embeddings


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML for {type(v).__name__}")


def toml(sections: dict[str, dict[str, Any]]) -> str:
    return "\n".join(
        f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in body.items()) for name, body in sections.items()
    )


def config(harness: str, run_dir: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    return {
        "run": {
            "dir": str(run_dir),
            "tasks": "shipped",
            "eval_split": "train",
            "max_concurrent_rollouts": args.tasks,
            "seed": 0,
        },
        "engine": {
            "kind": "hf",
            "model": MODEL,
            "dtype": "float32",
            "max_batch_size": args.tasks,
            "max_context": WINDOW,
            "num_threads": 2,
            "seed": 0,
        },
        "proxy": {"temperature": 1.0, "max_tokens": args.max_tokens, "max_context": WINDOW, "request_timeout_s": 1800},
        "sandbox": {"backend": "local", "agent_timeout_s": args.timeout_s, "retries": 0, "memory_mb": 3072},
        "harness": {"name": harness, "max_turns": args.max_turns},
    }


def run_eval(cmd: list[str], timeout_s: float | None) -> tuple[int, str]:
    """Run one `legorl eval` in its own process group; past `timeout_s` the whole group (the
    eval, its harness processes and sandboxes) is killed, and the row says so."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -1, f"not finished within --harness-timeout-s {timeout_s:g}; {out[-1500:]}"


def row(harness: str, summary: dict[str, Any] | None, wall_s: float, rc: int, tail: str) -> dict[str, Any]:
    if summary is None:
        return {"harness": harness, "ok": False, "exit_code": rc, "wall_s": round(wall_s, 1), "error": tail[-1500:]}
    turns = summary.get("turns", {})
    statuses = summary.get("status_counts", {})
    infra = sum(n for s, n in statuses.items() if s in ("infra_error", "sandbox_start_failed", "engine_error"))
    return {
        "harness": harness,
        "ok": rc == 0,
        "wall_s": round(wall_s, 1),
        "rollouts": summary.get("samples"),
        "status_counts": statuses,
        "pass@1": summary.get("pass@1"),
        "action_format": turns.get("action_format"),
        "turns": turns.get("count"),
        "turns_per_rollout": turns.get("per_rollout"),
        "action_share": turns.get("action_share"),
        "parse_share": turns.get("parse_share"),
        "prompt_tokens_per_turn": turns.get("prompt_tokens"),
        "completion_tokens_per_turn": turns.get("completion_tokens"),
        "seconds_per_turn": turns.get("seconds"),
        "finish_length_share": turns.get("finish_length_share"),
        "context_exceeded": turns.get("context_exceeded"),
        "exited_before_first_call": turns.get("exited_before_first_call"),
        "delivered_fraction": turns.get("delivered_fraction"),
        "no_5xx": infra == 0,
        "no_infra": infra == 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--harness", nargs="*", default=list(HARNESSES), help="default: all ten")
    ap.add_argument("--tasks", type=int, default=5)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256, help="the proxy's cap on a turn's completion")
    ap.add_argument("--timeout-s", type=float, default=1500.0, help="a rollout's agent timeout")
    ap.add_argument("--harness-timeout-s", type=float, default=None, help="give up on one harness after this")
    ap.add_argument("--out", type=Path, default=None, help="keep the configs, stores and eval JSONs here")
    args = ap.parse_args()
    unknown = [h for h in args.harness if h not in HARNESSES]
    if unknown:
        sys.exit(f"unknown harness {', '.join(unknown)} (known: {', '.join(HARNESSES)})")
    out = args.out or Path(tempfile.mkdtemp(prefix="legorl-harness-real-"))
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    rows = []
    for h in args.harness:
        cfg_path, result = out / f"{h}.toml", out / f"{h}.json"
        cfg_path.write_text(toml(config(h, out / f"run-{h}", args)))
        t0 = time.perf_counter()
        cmd = [
            sys.executable,
            "-m",
            "legorl.cli",
            "eval",
            str(cfg_path),
            "--limit",
            str(args.tasks),
            "--out",
            str(result),
        ]
        rc, said = run_eval(cmd, args.harness_timeout_s)
        wall = time.perf_counter() - t0
        summary = json.loads(result.read_text()) if rc == 0 and result.exists() else None
        rows.append(row(h, summary, wall, rc, said))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "model": MODEL,
                "window": WINDOW,
                "tasks": args.tasks,
                "max_turns": args.max_turns,
                "max_tokens": args.max_tokens,
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "all_ok": all(r.get("ok") and r.get("no_infra") and r.get("delivered_fraction") == 1.0 for r in rows),
                "rows": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
