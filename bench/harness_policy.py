"""Which shape of the native-harness policy learns: harness-qwen3 variants through mini-swe-agent.

The paper-table configs (examples/quickstart-<harness>.toml) train `harness-qwen3` inside a
native harness, an hour a run. Whether a policy shape can learn the calc task's one choice at
all (fix the function the test output says FAIL, not the first one listed) shows in ten
minutes through the quickstart's own harness: this script runs examples/quickstart.toml (or
`--config`'s run, e.g. a paper-table config) with the policy swapped for each variant below
(same demonstrations, SFT, GSPO and held-out tasks; 16 GSPO steps, no control) and prints
one JSON object: per variant the held-out warm start and end, the gain with its 95%
interval, and each GSPO step's reward (a step draws the same tasks in every variant, so the
curves compare step by step).

    harness-qwen3     as committed: the quickstart's 512-token BPE (its names and FAIL/PASS are one
                      token each), QK-norm gain 1.25 at init (`init.json`)
    gain1             the family's own QK-norm gain of 1 (learns through mini-swe-agent; inside
                      Claude Code it imitated nothing: docs/measured.md)
    gain1.5           a higher gain (copies names inside Claude Code; GSPO moved nothing)
    bpe4096+gain1.5   the policy until 2026-12-06: the bundled 4,096-token BPE (learnt from
                      Python's standard library: `FAIL` is two tokens, `PASS` three), gain 1.5
    bpe4096+gain1     the bundled BPE at the family's own gain

    .venv/bin/python bench/harness_policy.py [--only harness-qwen3,gain1] [--config TOML] [--out DIR]

About 10-12 minutes a variant on two idle cores: a bench run, never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, dict[str, Any]] = {
    "harness-qwen3": {},
    "gain1": {"gain": 1.0},
    "gain1.5": {"gain": 1.5},
    "bpe4096+gain1.5": {"bpe4096": True, "gain": 1.5},
    "bpe4096+gain1": {"bpe4096": True, "gain": 1.0},
}


def materialise(name: str, change: dict[str, Any], out: Path) -> Path:
    """The variant as an HF model directory: harness-qwen3's committed files with the change,
    random init from the bundled seed (legorl.models does the init, as for a bundled model)."""
    from legorl import models

    src = out / "src" / name
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(models.BUNDLED["harness-qwen3"], src)
    if change.get("bpe4096"):  # without its own tokenizer files a bundled model takes the shared BPE
        for f in ("tokenizer.json", "tokenizer_config.json"):
            (src / f).unlink()
        cfg = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**cfg, "vocab_size": 4096}, indent=2))
    if "gain" in change:  # 1.0 is the family's own init: the norms' weights start at one
        init = json.loads((src / models.INIT_FILE).read_text())
        (src / models.INIT_FILE).write_text(json.dumps({**init, "qk_norm_gain": change["gain"]}, indent=2))
    models.BUNDLED[f"variant-{name}"] = src
    return models.resolve_model(f"variant-{name}")


def config(model_dir: Path, run_dir: Path, base: Path, start: bool = True) -> str:
    """`base` (a config of the one loop) with the variant as policy, a longer token budget for
    its calls (the quickstart's 48 cut some fix lines short), 16 GSPO steps,
    no control and an hour's budget; without `start`, no held-out evaluation of the random
    init (0% in every harness so far, and 5-8 minutes inside a native harness)."""
    text = base.read_text()
    if not start:
        text = re.sub(r'(?m)^at = \["start", ', "at = [", text, count=1)
    for name in ("quickstart-qwen3", "harness-qwen3"):
        text = text.replace(f'"{name}"', json.dumps(str(model_dir)))
    text = re.sub(r'(?m)^dir = ".*"', f"dir = {json.dumps(str(run_dir))}", text, count=1)
    text = re.sub(r"(?m)^steps = \d+", "steps = 16", text, count=1)  # [run] comes first: GSPO's steps
    text = re.sub(r"(?m)^time_budget_s = \d+", "time_budget_s = 3600", text)
    text = re.sub(r"(?m)^max_tokens = (48|64)\b", "max_tokens = 96", text)
    return re.sub(r"(?m)^control_steps = \d+", "control_steps = 0", text)


def run_variant(name: str, out: Path, base: Path, start: bool) -> dict[str, Any]:
    model_dir = materialise(name, VARIANTS[name], out)
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = out / f"{name}.toml"
    cfg.write_text(config(model_dir, run_dir, base, start))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "legorl.cli", "train", str(cfg)], cwd=ROOT, capture_output=True, text=True
    )
    wall = round(time.monotonic() - t0, 1)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:], "wall_s": wall}
    report = json.loads((run_dir / "heldout_results.json").read_text())
    db = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    rewards = [
        round(v, 3)
        for (v,) in db.execute("SELECT value FROM metrics WHERE key = 'reward/mean' AND step >= 0 ORDER BY step")
    ]
    evals = report.get("evaluations", {})
    return {
        "warm_start": evals.get("warm_start", {}).get("resolved_rate"),
        "end": evals.get("end", {}).get("resolved_rate"),
        "gain": report.get("gains", {}).get("gspo_over_warm_start"),
        "step_rewards": rewards,
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(VARIANTS), help="comma-separated variants of " + ", ".join(VARIANTS))
    ap.add_argument("--out", type=Path, default=ROOT / "examples" / "runs" / "harness-policy")
    ap.add_argument(
        "--config",
        type=Path,
        default=ROOT / "examples" / "quickstart.toml",
        help="the run to vary (default: the quickstart's, through mini-swe-agent; "
        "examples/quickstart-claude-code.toml puts the variants inside Claude Code, ~50 min each)",
    )
    ap.add_argument("--no-start", action="store_true", help="skip the held-out evaluation of the random init")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    if unknown := [n for n in names if n not in VARIANTS]:
        raise SystemExit(f"--only: unknown variants {unknown} (known: {', '.join(VARIANTS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    rows = {}
    for name in names:
        rows[name] = run_variant(name, args.out, args.config, not args.no_start)
        print(json.dumps({"variant": name, **rows[name]}), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "bench": "harness_policy",
                "config": str(args.config),
                "variants": rows,
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
