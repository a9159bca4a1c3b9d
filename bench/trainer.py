"""GSPO training throughput of `legorl.train.Trainer` next to the naive HF step.

Two rows per model: `naive` is the plain HF training step (`naive_step_time` here: full HF forward, fp32
cross-entropy over the materialised (B·T × vocab) logits, backward, AdamW); `legorl` is one
`Trainer.step` on synthetic trajectories of the same token count (groups of 4, a quarter of
each sequence prompt, the rest sampled; MoE rows replay a recorded routing): packed
segments without padding, chunked fp32 log-softmax over the vocabulary, GSPO loss, AdamW,
plus everything a real step does (advantages, mismatch and routing metrics). tokens/s counts
every token forwarded; MFU uses 6·active-params·tokens.

    python bench/trainer.py                 # CPU: small sizes and the bundled tiny models
    python bench/trainer.py --size gpu      # H200 sizes, bf16 (run-ready; not measured here)
    python bench/trainer.py --size gpu --master-fp32 --experts grouped_mm
    python bench/trainer.py --only smollm2-135m-instruct --rounds 3 --warm 1  # a real 49k vocabulary

`--only NAME` runs just that model's pair of rows (a bundled name such as
`smollm2-135m-instruct`, a real pretrained model, or `probe-dense`...).

`--rows shared` runs instead the harness-shaped A/B: one GSPO group of `branches` rollouts
sharing a `prefix`-token first prompt (a native harness's system prompt, tool list and task),
each with 0.5-2k tokens of its own, one `Trainer.step` with `packing = "packed"` against one
with `"shared_prefix"` (the trainer's default), on the same model and trainer:

    python bench/trainer.py --rows shared --only quickstart-qwen3 --shapes 6000x16
    python bench/trainer.py --rows shared --only smollm2-135m-instruct --shapes 6000x8,20000x16

Every A/B is interleaved: the two pipelines alternate in one process (A, B, A, B, ...) for
`--rounds` rounds (at least 3) after `--warm` warm-up rounds, and each reports its median step
time and spread (min, max), and the process's CPU seconds per step (median, min, max), which a
loaded machine's waiting does not inflate: the machines these run on are shared, and rows run
one after the other once read 1.60x where a rerun read 0.94x. Every row reports its peak memory: CUDA's
allocator peak on a GPU; on CPU the process's peak resident set during each step (VmHWM, reset
before it), median over rounds. Shared rows add the tokens the decoder computed per step.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from legorl.train import varlen
from legorl.train.config import TrainerConfig
from legorl.train.trainer import Trainer, load_lm
from legorl.types import AlignmentStats, Outcome, Segment, Status, Trajectory


def probe_config(kind: str, small: bool):
    """The probe model configs (dense and MoE, small on CPU)."""
    if kind == "dense":
        return AutoConfig.for_model(
            "qwen3",
            vocab_size=32000,
            hidden_size=128 if small else 2048,
            intermediate_size=256 if small else 6144,
            num_hidden_layers=2 if small else 16,
            num_attention_heads=4 if small else 16,
            num_key_value_heads=2 if small else 8,
            head_dim=32 if small else 128,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
        )
    return AutoConfig.for_model(
        "qwen3_moe",
        vocab_size=32000,
        hidden_size=128 if small else 1024,
        intermediate_size=256 if small else 2048,
        moe_intermediate_size=64 if small else 512,
        num_hidden_layers=2 if small else 12,
        num_attention_heads=4 if small else 16,
        num_key_value_heads=2 if small else 4,
        head_dim=32 if small else 64,
        num_experts=8 if small else 64,
        num_experts_per_tok=2 if small else 8,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )


def active_params(m: torch.nn.Module) -> tuple[int, int]:
    cfg = m.config
    total = sum(p.numel() for p in m.parameters())
    if getattr(cfg, "num_experts", 0):
        per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
        return total, total - cfg.num_hidden_layers * per_expert * (cfg.num_experts - cfg.num_experts_per_tok)
    return total, total


def synthetic(m: torch.nn.Module, B: int, T: int, seed: int) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    vocab = m.get_input_embeddings().weight.shape[0]
    cfg = m.config
    layers, k, experts = cfg.num_hidden_layers, getattr(cfg, "num_experts_per_tok", 0), getattr(cfg, "num_experts", 0)
    out = []
    for i in range(B):
        ids = torch.randint(3, vocab, (T,), generator=g).tolist()
        prompt = T // 4
        routing = None
        if experts:
            routing = torch.rand(T, layers, experts, generator=g).topk(k, dim=-1).indices.tolist()
        seg = Segment([0], ids, [0] * prompt + [1] * (T - prompt), [0.0] * prompt + [-2.0] * (T - prompt), [0], routing)
        out.append(
            Trajectory(
                f"s{i}",
                [seg],
                AlignmentStats(),
                instance_id=f"task{i // 4}",
                outcome=Outcome(float(i % 4) / 3, Status.FAILED),
            )
        )
    return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    """Start a step's peak memory from what is held now."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def peak_gib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


Step = Callable[[], dict]  # one step of a pipeline; returns what the row should add (tokens computed...)


def interleaved(steps: dict[str, Step], rounds: int, warm: int, device: str) -> dict[str, dict]:
    """Each pipeline's step in turn (A, B, A, B, ...) for `warm` + `rounds` rounds, so a change
    in the machine's load falls on both; per pipeline the median step time, its spread and the
    median peak memory over the measured rounds."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}  # process CPU seconds: what a loaded machine's wait hides
    peaks: dict[str, list[float]] = {k: [] for k in steps}
    extra: dict[str, dict] = {k: {} for k in steps}
    for r in range(warm + rounds):
        for name, step in steps.items():
            sync(device)
            peak_reset(device)
            t0, c0 = time.perf_counter(), time.process_time()
            info = step()
            sync(device)
            seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
            if r >= warm:
                times[name].append(seconds)
                cpu[name].append(cpu_seconds)
                peaks[name].append(peak_gib(device))
                extra[name] = info
    return {
        name: {
            "step_s": round(statistics.median(times[name]), 4),
            "step_s_min": round(min(times[name]), 4),
            "step_s_max": round(max(times[name]), 4),
            "cpu_s": round(statistics.median(cpu[name]), 2),
            "cpu_s_min": round(min(cpu[name]), 2),
            "cpu_s_max": round(max(cpu[name]), 2),
            "rounds": len(times[name]),
            ("peak_mem_GiB" if device.startswith("cuda") else "peak_rss_GiB"): round(statistics.median(peaks[name]), 2),
            **extra[name],
        }
        for name in steps
    }


def naive_stepper(m: torch.nn.Module, B: int, T: int, device: str) -> Step:
    """A plain HF step: forward, fp32 cross-entropy over full logits, backward, AdamW."""
    opt = torch.optim.AdamW(m.parameters(), lr=1e-6, fused=device.startswith("cuda") or None)
    x = torch.randint(0, m.config.vocab_size, (B, T), device=device)

    def step() -> dict:
        out = m(input_ids=x)
        loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {}

    return step


def make_trainer(m: torch.nn.Module, args: argparse.Namespace, microbatch_tokens: int) -> Trainer:
    cfg = TrainerConfig(
        device=args.device,
        dtype=args.dtype,
        lr=1e-6,
        logprob_chunk=args.chunk,
        master_weights_fp32=args.master_fp32,
        max_tokens_per_microbatch=microbatch_tokens,
        experts_implementation=None,
        attn_implementation=m.config._attn_implementation,
        gradient_checkpointing=args.checkpointing,
    )
    return Trainer(cfg, lm=m)


def trainer_stepper(trainer: Trainer, trajs: list[Trajectory], packing: str | None = None) -> Step:
    """One `Trainer.step` (with `packing`, else the trainer's own); returns the sampled tokens
    and the tokens its decoder computed (every forward of the step, summed)."""

    def step() -> dict:
        if packing is not None:
            trainer.opts.packing = packing
        computed: list[int] = []
        hook = trainer.lm.get_decoder().register_forward_hook(
            lambda mod, a, kw, out: computed.append(
                int((kw.get("input_ids") if kw.get("input_ids") is not None else kw["inputs_embeds"]).shape[1])
            ),
            with_kwargs=True,
        )
        try:
            metrics = trainer.step(trajs)
        finally:
            hook.remove()
        return {"sampled_tokens": int(metrics.get("train/sampled_tokens", 0)), "tokens_computed": sum(computed)}

    return step


def harness_group(vocab: int, prefix: int, branches: int, lo: int, hi: int, seed: int) -> list[Trajectory]:
    """One GSPO group inside a native harness: every rollout opens with the same `prefix`
    tokens (system prompt, tool list, task), then its own lo..hi tokens, completions and tool
    outputs alternating every 64 tokens; rewards spread so every rollout has an advantage."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(prefix)]
    out = []
    for b in range(branches):
        own = [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))]
        mask = [0] * prefix + [1 if (i // 64) % 2 == 0 else 0 for i in range(len(own))]
        lps = [-2.0 * x for x in mask]
        seg = Segment([0], shared + own, mask, lps, [0])
        outcome = Outcome(float(b % 4) / 3, Status.FAILED)
        out.append(Trajectory(f"b{b}", [seg], AlignmentStats(), instance_id="task0", outcome=outcome))
    return out


def row(kind: str, pipeline: str, m: torch.nn.Module, B: int, T: int, stats: dict, device: str) -> dict:
    total, active = active_params(m)
    tok = B * T
    t = stats["step_s"]
    r = {
        "kind": kind,
        "pipeline": pipeline,
        "params_M": round(total / 1e6, 2),
        "active_M": round(active / 1e6, 2),
        "B": B,
        "T": T,
        **stats,
        "tokens_per_s": round(tok / t),
    }
    if device.startswith("cuda"):
        flops = 6 * active * tok
        r["mfu_vs_989"] = round(flops / t / 989e12, 4)
        r["mfu_vs_790"] = round(flops / t / 790e12, 4)
    return r


def shared_rows(name: str, make: Callable[[str], torch.nn.Module], args: argparse.Namespace) -> list[dict]:
    """Packed against shared-prefix `Trainer.step`s on harness-shaped groups, interleaved."""
    lo, hi = (int(x) for x in args.branch.split(","))
    m = make(varlen.register())
    rows = []
    for shape in args.shapes.split(","):
        prefix, branches = (int(x) for x in shape.split("x"))
        trajs = harness_group(int(m.config.vocab_size), prefix, branches, lo, hi, seed=prefix + branches)
        tokens = sum(len(t.segments[0].token_ids) for t in trajs)
        trainer = make_trainer(m, args, max(args.microbatch_tokens, tokens))  # the group in one micro-batch
        # packed need not hold the group at once (nothing is shared): with --packed-microbatch-tokens
        # it runs as today's trainer would, in micro-batches of that size (a model whose activations
        # for the whole group would not fit in memory, SmolLM2's ~2 MB a token)
        packed = make_trainer(m, args, args.packed_microbatch_tokens) if args.packed_microbatch_tokens else trainer
        try:
            stats = interleaved(
                {
                    "packed": trainer_stepper(packed, trajs, "packed"),
                    "shared_prefix": trainer_stepper(trainer, trajs, "shared_prefix"),
                },
                args.rounds,
                args.warm,
                args.device,
            )
        except Exception as e:  # one failing shape must not hide the others' numbers
            rows.append({"kind": name, "shape": shape, "error": repr(e)[:300]})
            continue
        a, b = stats["packed"], stats["shared_prefix"]
        r = {
            "kind": name,
            "rows": "shared",
            "prefix": prefix,
            "branches": branches,
            "branch_tokens": [lo, hi],
            "tokens": tokens,
            "packed_microbatch_tokens": args.packed_microbatch_tokens or max(args.microbatch_tokens, tokens),
            "packed": a,
            "shared_prefix": b,
            "fewer_tokens": round(a["tokens_computed"] / max(1, b["tokens_computed"]), 2),
            "speedup": round(a["step_s"] / b["step_s"], 2),
            "speedup_spread": [
                round(a["step_s_min"] / b["step_s_max"], 2),
                round(a["step_s_max"] / b["step_s_min"], 2),
            ],
            "cpu_ratio": round(a["cpu_s"] / b["cpu_s"], 2),
        }
        rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)  # progress, if cut short
        del trainer, packed
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description="GSPO trainer throughput vs the naive HF step")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", choices=["cpu", "gpu"], default=None)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: fp32 on CPU, bf16 on GPU")
    ap.add_argument("--rows", choices=["naive", "shared"], default="naive", help="naive vs legorl, or packed vs shared")
    ap.add_argument("--rounds", "--steps", type=int, default=3, help="measured rounds, each one step of each pipeline")
    ap.add_argument("--warm", type=int, default=1, help="warm-up rounds (not measured)")
    ap.add_argument("--chunk", type=int, default=4096, help="rows per chunk of the LM head")
    ap.add_argument("--microbatch-tokens", type=int, default=16384)
    ap.add_argument("--experts", default="", help="experts_implementation for MoE (e.g. grouped_mm)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--only", default="", help="run only this model's rows (e.g. smollm2-135m-instruct)")
    ap.add_argument("--B", type=int, default=0, help="sequences per step for --only (default: 2 on CPU)")
    ap.add_argument("--T", type=int, default=0, help="tokens per sequence for --only (default: 512 on CPU)")
    ap.add_argument("--shapes", default="6000x8,6000x16", help="--rows shared: prefix x branches, comma-separated")
    ap.add_argument("--branch", default="500,2000", help="--rows shared: a branch's own tokens, lo,hi")
    ap.add_argument(
        "--packed-microbatch-tokens",
        type=int,
        default=0,
        help="--rows shared: micro-batch of the packed rows (default: the whole group, as shared runs it)",
    )
    ap.add_argument(
        "--checkpointing",
        default=None,
        choices=["false", "true", "auto"],
        help="the trainer's gradient_checkpointing; default: auto for naive rows (the trainer's default), "
        "false for shared rows (with it on, shared_prefix falls back to packed)",
    )
    ap.add_argument(
        "--master-fp32",
        action="store_true",
        help="bf16 with fp32 master weights (FSDP2 mixed precision, what a real run uses); "
        "default: train the bf16 parameters directly, as the naive probe does",
    )
    args = ap.parse_args()
    args.checkpointing = {"false": False, "true": True, "auto": "auto"}.get(
        args.checkpointing or ("false" if args.rows == "shared" else "auto")
    )
    if args.rounds < 3:
        print("note: fewer than 3 rounds: the spread says little", file=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    small = (args.size or ("cpu" if args.device == "cpu" else "gpu")) == "cpu"
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    dtype = getattr(torch, args.dtype)
    B, T = (2, 64) if small else (8, 2048)
    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": args.device,
        "dtype": args.dtype,
        "master_weights_fp32": bool(args.master_fp32 and args.dtype == "bfloat16"),
        "size": "cpu" if small else "gpu",
        "rows_kind": args.rows,
        "rounds": args.rounds,
        "warm": args.warm,
        "gradient_checkpointing": args.checkpointing,
        "threads": torch.get_num_threads(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "rows": [],
    }
    if args.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name()
    models: list[tuple[str, Callable[[str], torch.nn.Module]]] = []
    for kind in ("dense", "moe"):

        def make(attn: str, kind: str = kind) -> torch.nn.Module:
            torch.manual_seed(0)
            kw = {"experts_implementation": args.experts} if kind == "moe" and args.experts else {}
            cfg = probe_config(kind, small)
            return (
                AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn, **kw)
                .to(args.device)
                .train()
            )

        models.append((f"probe-{kind}", make))
    bundled = ["tiny-qwen3", "tiny-qwen3-moe"] if small else []  # the bundled models at a longer sequence as well
    if args.rows == "shared":  # harness-shaped groups: the quickstart's model unless --only names another
        models, bundled = [], [args.only or "quickstart-qwen3"]
    elif args.only:
        models = [(k, f) for k, f in models if k == args.only]
        bundled = [] if models else [args.only]
    for name in bundled:

        def make_bundled(attn: str, name: str = name) -> torch.nn.Module:
            return load_lm(TrainerConfig(model=name, dtype=args.dtype, attn_implementation=attn)).to(args.device)

        models.append((name, make_bundled))
    if args.rows == "shared":
        for kind, make in models:
            out["rows"] += shared_rows(kind, make, args)
        out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(out))
        return
    # the tiny bundled models at a longer sequence; a real vocabulary (SmolLM2: 49k) at the
    # T of a compact agent turn on CPU, at the probe's size on a GPU
    sizes = {"tiny-qwen3": (8, 256), "tiny-qwen3-moe": (8, 256)}
    other = (2, 512) if small else (B, T)
    ours = varlen.register()
    for kind, make in models:
        b, t = (B, T) if kind.startswith("probe") else sizes.get(kind, other)
        b, t = args.B or b, args.T or t
        try:
            naive, legorl = make("sdpa"), make(ours)
            trajs = synthetic(legorl, b, t, seed=0)
            stats = interleaved(
                {
                    "naive": naive_stepper(naive, b, t, args.device),
                    "legorl_gspo": trainer_stepper(make_trainer(legorl, args, args.microbatch_tokens), trajs),
                },
                args.rounds,
                args.warm,
                args.device,
            )
            out["rows"].append(row(kind, "naive", naive, b, t, stats["naive"], args.device))
            r = row(kind, "legorl_gspo", legorl, b, t, stats["legorl_gspo"], args.device)
            a, g = stats["naive"], stats["legorl_gspo"]
            r["speedup_vs_naive"] = round(a["step_s"] / g["step_s"], 3)
            r["speedup_vs_naive_spread"] = [
                round(a["step_s_min"] / g["step_s_max"], 3),
                round(a["step_s_max"] / g["step_s_min"], 3),
            ]
            out["rows"].append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)  # progress, if cut short
            del naive, legorl
        except Exception as e:  # one failing size must not hide the others' numbers
            out["rows"].append({"kind": kind, "error": repr(e)[:300]})
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
