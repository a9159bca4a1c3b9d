"""How well a small policy imitates demonstrations recorded inside a native harness, per
architecture variant. Prints one JSON line per variant, then one summary object.

The demonstrations are a run's own (`legorl train` with a `[warm_start]` records them at step
-1 of its store: the exact ids the proxy saw through e.g. Claude Code). Each variant is
`harness-qwen3`'s config from random init with some changes, fine-tuned with the loop's own
SFT (`legorl.train.sft`, shared-prefix packing) on the first `--train` demonstrations; then
the loss per sampled token on the rest, and the mean probability of a whole held-out
demonstration (what sampling at temperature 1 reproduces exactly).

Then it samples the fix turn itself (the turn whose demonstration holds `sed -i`) from each
held-out demonstration's own prompt at temperature 1, as the warm-start evaluation would, and
checks the sampled line: both names the same, the operator the name's, the name one the test
output listed, and the one whose test failed. A low loss per token can hide a policy that
does not copy a name eight tokens back; these rates cannot.

Variants (joined by `+`): `base`; `theta<N>` (rope_theta, e.g. theta10000); `qk<G>` (the
QK-norm gain at init, e.g. qk1.5: see `legorl.models.apply_init`); `swa<W>` (the first layer
a W-token sliding window); `L<N>` (N layers).

    .venv/bin/python bench/harness_sft.py --run RUN_DIR [--variants base,qk1.5+theta10000]
        [--steps 60] [--train 200]

Minutes per variant on two cores (~7 s an SFT step of 16 Claude Code demonstrations).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def demonstrations(run_dir: Path) -> list[Any]:
    from legorl.store.run_store import RunStore

    db = sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True)
    sessions = [r[0] for r in db.execute("SELECT session_id FROM trajectories WHERE step = -1 ORDER BY id")]
    store = RunStore(run_dir / "run.sqlite", readonly=True)
    return [t for t in (store.load_trajectory(s) for s in sessions) if t is not None]


def tail(demos: list[Any], n: int) -> list[Any]:
    """A diagnosis, not a policy: each segment cut to its last `n` tokens (the harness's
    prompt dropped), to tell a context too long to learn in from too few steps."""
    import dataclasses

    def cut(seg: Any) -> Any:
        return dataclasses.replace(
            seg,
            token_ids=seg.token_ids[-n:],
            loss_mask=seg.loss_mask[-n:],
            logprobs=seg.logprobs[-n:],
            policy_versions=seg.policy_versions[-n:],
        )

    return [dataclasses.replace(t, segments=[cut(s) for s in t.segments]) for t in demos]


def variant_config(variant: str) -> tuple[dict[str, Any], float | None]:
    """harness-qwen3's committed config with the variant's changes, and its QK-norm gain."""
    cfg = json.loads((ROOT / "legorl/assets/models/harness-qwen3/config.json").read_text())
    gain = None
    for part in variant.split("+"):
        if part == "base":
            continue
        if part.startswith("theta"):
            cfg["rope_theta"] = float(part[5:])
        elif part.startswith("qk"):
            gain = float(part[2:])
        elif part.startswith("swaall"):  # every layer windowed: a local-attention policy
            cfg.update(use_sliding_window=True, sliding_window=int(part[6:]))
            cfg["layer_types"] = ["sliding_attention"] * cfg["num_hidden_layers"]
        elif part.startswith("swa"):
            cfg.update(use_sliding_window=True, sliding_window=int(part[3:]))
        elif part.startswith("L"):
            cfg["num_hidden_layers"] = int(part[1:])
        else:
            raise SystemExit(f"--variants: unknown part {part!r} (base, theta<N>, qk<G>, swa<W>, L<N>)")
    if cfg.get("use_sliding_window") and "layer_types" not in cfg:  # the first layer windowed, the rest full
        cfg["layer_types"] = ["sliding_attention"] + ["full_attention"] * (cfg["num_hidden_layers"] - 1)
    return cfg, gain


_FIX = re.compile(r"sed -i 's\|\^def (\w+)\.\*\|def (\w+)\(a, b\): return a (\S+) b\|")


def fix_turns(demos: list[Any], tokenizer: Any) -> list[tuple[list[int], str, str | None]]:
    """Each demonstration's fix turn as (prompt ids, the test output before it, the failing
    function): the prompt is the segment up to the first sampled token of the turn whose
    text holds `sed -i`."""
    from legorl.quickstart.expert import failing_function

    out = []
    for t in demos:
        for seg in t.segments:
            mask, ids = seg.loss_mask, seg.token_ids
            i = 0
            while i < len(ids):
                if not mask[i]:
                    i += 1
                    continue
                j = i
                while j < len(ids) and mask[j]:
                    j += 1
                if "sed -i" in tokenizer.decode(ids[i:j]):
                    observation = tokenizer.decode(ids[max(0, i - 400) : i])
                    out.append((ids[:i], observation, failing_function(observation)))
                    break
                i = j
    return out


def fix_rates(lm: Any, tokenizer: Any, turns: list[tuple[list[int], str, str | None]], seed: int = 0) -> dict[str, Any]:
    """Sample each fix turn at temperature 1 and judge the line it writes."""
    from legorl.quickstart.family import POOL

    lm.set_attn_implementation("eager")
    torch.manual_seed(seed)
    counts = {"has_fix_line": 0, "names_agree": 0, "operator_fits": 0, "name_listed": 0, "name_failing": 0}
    examples = []
    with torch.no_grad():
        for prompt, observation, failing in turns:
            out = lm.generate(
                torch.tensor([prompt]), max_new_tokens=72, do_sample=True, temperature=1.0, top_k=0, top_p=1.0
            )
            text = tokenizer.decode(out[0, len(prompt) :])
            m = _FIX.search(text)
            if len(examples) < 3:
                examples.append(text[:160])
            if not m:
                continue
            a, b, op = m.groups()
            counts["has_fix_line"] += 1
            ok = a == b and POOL.get(a) == op
            counts["names_agree"] += a == b
            counts["operator_fits"] += POOL.get(a) == op
            counts["name_listed"] += ok and re.search(rf"(PASS|FAIL) {a}\b", observation) is not None
            counts["name_failing"] += ok and a == failing
    n = max(1, len(turns))
    return {"fix_turns": len(turns), **{k: round(v / n, 3) for k, v in counts.items()}, "samples": examples}


def run_variant(
    variant: str, train: list[Any], held: list[Any], steps: int, lr: float, tokenizer: Any, batch_size: int = 16
) -> dict[str, Any]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from legorl.models import apply_init
    from legorl.train import varlen
    from legorl.train.batch import pack
    from legorl.train.logprobs import LogprobOptions, PolicyModel
    from legorl.train.sft import SFTConfig, sft

    cfg, gain = variant_config(variant)
    torch.manual_seed(0)
    lm = Qwen3ForCausalLM(Qwen3Config(**cfg))
    lm.set_attn_implementation(varlen.register())
    apply_init(lm, {"qk_norm_gain": gain} if gain else {})
    policy = PolicyModel(lm)
    opts = LogprobOptions(packing="shared_prefix")
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, betas=(0.9, 0.99), foreach=True)
    curve: dict[int, float] = {}
    t0 = time.perf_counter()
    sft(
        policy,
        train,
        SFTConfig(steps=steps, batch_size=batch_size, lr=lr, warmup_steps=min(20, steps // 5)),
        opt,
        log=lambda step, m: curve.__setitem__(step, round(m["sft/loss"], 4)),
        log_every=10,
        opts=opts,
    )
    seconds = time.perf_counter() - t0
    policy.eval()
    sums: list[float] = []
    tokens = 0.0
    with torch.no_grad():
        for i in range(0, len(held), 8):
            chunk = held[i : i + 8]
            for mb in pack([(j, t, 1.0) for j, t in enumerate(chunk)], "trajectory", max_tokens=1 << 30):
                lp_N = policy(mb, opts).logprobs_N * mb.mask_N
                for j in range(len(chunk)):
                    sel = mb.traj_ids_N == j
                    if bool(sel.any()):
                        sums.append(float(lp_N[sel].sum()))
                        tokens += float(mb.mask_N[sel].sum())
    rates = fix_rates(lm, tokenizer, fix_turns(held, tokenizer))
    return {
        "variant": variant,
        "steps": steps,
        "batch_size": batch_size,
        "fix_turn": rates,
        "sft_loss": curve,
        "sft_s": round(seconds, 1),
        "heldout_loss_per_token": round(-sum(sums) / tokens, 4),
        "heldout_p_whole_mean": float(f"{sum(math.exp(s) for s in sums) / len(sums):.3g}"),
        "heldout_demonstrations": len(sums),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a run directory whose store holds demonstrations")
    ap.add_argument("--variants", default="base,theta10000,qk1.5+theta10000,qk1.5+theta10000+swa64")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--train", type=int, default=200, help="demonstrations trained on; the rest are held out")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--tail", type=int, default=0, help="diagnosis: keep each segment's last N tokens only")
    ap.add_argument("--batch-size", type=int, default=16, help="demonstrations per SFT step")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not (args.run / "run.sqlite").exists():
        raise SystemExit(f"--run {args.run}: no run.sqlite there")
    demos = demonstrations(args.run)
    if len(demos) <= args.train:
        raise SystemExit(f"--run {args.run}: {len(demos)} demonstrations, need more than --train {args.train}")
    torch.set_num_threads(args.threads)
    if args.tail:
        demos = tail(demos, args.tail)
    from transformers import AutoTokenizer

    from legorl.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("harness-qwen3"))
    load_before = os.getloadavg()
    rows = []
    for variant in args.variants.split(","):
        row = run_variant(
            variant, demos[: args.train], demos[args.train :], args.steps, args.lr, tokenizer, args.batch_size
        )
        rows.append({"tail": args.tail, **row} if args.tail else row)
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "bench": "harness_sft",
                "run": str(args.run),
                "rows": rows,
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
