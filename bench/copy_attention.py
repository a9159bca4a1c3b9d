"""Does a calc policy copy the function name inside its own fix line, and does its attention focus there?

The calc fix line is `sed -i 's|^def NAME.*|def NAME(a, b): return a OP b|' calc.py`. The second
NAME must repeat the first, eight tokens back. A policy that cannot do this writes lines whose
names differ and fixes nothing. This script reads a run's demonstrations (the warm start's
SFT data, step -1 in the run store) with a checkpoint of that run, at the query that predicts
the second NAME, and prints one JSON object per demonstration:

    p_copy           the probability the checkpoint gives the first NAME's token there
    p_copy_at_zero   the same, with those tokens moved to positions 0..: the windows'
                     attention is relative, so a difference would be a position effect
    heads            per layer, per head: the largest attention weight at that query, and the
                     weight on the sequence's first four tokens (a sink, when they are in reach)

Only the last 700 tokens are read, at their own positions: the policies here attend at
most 2 x 256 tokens back, so that is the whole of what they see.

    .venv/bin/python bench/copy_attention.py RUN_DIR CHECKPOINT_DIR [--tokenizer NAME] [--n 8]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path
from typing import Any

TAIL = 700


def probe(model: Any, tok: Any, prompt_ids: list[int], completion_ids: list[int]) -> dict[str, Any] | None:
    import torch

    pieces = [tok.decode([i]).strip() for i in completion_ids]
    defs = [k for k, p in enumerate(pieces) if p == "def"]
    if len(defs) < 2:
        return None
    ids = prompt_ids + completion_ids
    q = len(prompt_ids) + defs[1]  # this position's logits predict the second NAME
    start = max(0, q + 1 - TAIL)
    seq = torch.tensor([ids[start : q + 1]])
    name_at = len(prompt_ids) + defs[0] + 1 - start  # the first NAME's (first) token
    name = int(seq[0, name_at])
    with torch.no_grad():
        here = model(seq, position_ids=torch.arange(start, q + 1)[None], output_attentions=True)
        zero = model(seq, position_ids=torch.arange(0, q + 1 - start)[None])
    heads = [
        [{"max": round(float(w[h].max()), 3), "first4": round(float(w[h, :4].sum()), 3)} for h in range(w.shape[0])]
        for w in (a[0, :, -1] for a in here.attentions)
    ]
    return {
        "name": tok.decode([name]).strip(),
        "p_copy": round(float(here.logits[0, -1].softmax(-1)[name]), 3),
        "p_copy_at_zero": round(float(zero.logits[0, -1].softmax(-1)[name]), 3),
        "heads": heads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("checkpoint", type=Path, help="an HF model directory (a run's checkpoints/step_*/model)")
    ap.add_argument("--tokenizer", default="harness-qwen3", help="the policy's tokenizer (a model name or directory)")
    ap.add_argument("--n", type=int, default=8, help="demonstrations to read")
    args = ap.parse_args()
    if not (args.run_dir / "run.sqlite").is_file():
        raise SystemExit(f"copy_attention: no run.sqlite in {args.run_dir}")
    if not (args.checkpoint / "config.json").is_file():
        raise SystemExit(f"copy_attention: no config.json in {args.checkpoint}")
    from transformers import AutoModelForCausalLM

    from legorl.models import load_tokenizer
    from legorl.store.phase_steps import WARM_START_STEP
    from legorl.store.run_store import RunStore

    tok = load_tokenizer(args.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, attn_implementation="eager").eval()
    db = sqlite3.connect(f"file:{args.run_dir / 'run.sqlite'}?mode=ro", uri=True)
    sessions = [s for (s,) in db.execute("SELECT session_id FROM trajectories WHERE step = ?", (WARM_START_STEP,))]
    rows = []
    with RunStore(args.run_dir, readonly=True) as store:
        for sid in sessions:
            main_turns = [t for t in store.load_turns(sid) if not t.side_call]
            fix = next((t for t in main_turns if "sed" in tok.decode(list(t.completion_ids))), None)
            if fix and (row := probe(model, tok, list(fix.prompt_ids), list(fix.completion_ids))):
                rows.append(row)
            if len(rows) == args.n:
                break
    print(
        json.dumps(
            {"bench": "copy_attention", "run": str(args.run_dir), "checkpoint": str(args.checkpoint), "rows": rows}
        )
    )


if __name__ == "__main__":
    main()
