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
    python bench/trainer.py --only smollm2-135m-instruct --steps 2 --warm 1   # a real 49k vocabulary

`--only NAME` runs just that model's pair of rows (a bundled name such as
`smollm2-135m-instruct`, a real pretrained model, or `probe-dense`...). Every row reports its
peak memory: CUDA's allocator peak on a GPU, the process's peak resident set (sampled every
5 ms, above what it held before the row) on CPU.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable

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


class PeakRss:
    """Peak resident set size of this process while the block runs, sampled every 5 ms
    (on CPU there is no allocator counter; `ru_maxrss` only ever grows over the whole run)."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> PeakRss:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._rss())

    def fields(self) -> dict:
        return {
            "peak_rss_GiB": round(self.peak / 2**30, 2),
            "peak_rss_above_base_GiB": round((self.peak - self.base) / 2**30, 2),
        }


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def naive_step_time(m: torch.nn.Module, B: int, T: int, device: str, steps: int, warm: int) -> float:
    """Seconds per plain HF step: forward, fp32 cross-entropy over full logits, backward, AdamW."""
    opt = torch.optim.AdamW(m.parameters(), lr=1e-6, fused=device.startswith("cuda") or None)
    x = torch.randint(0, m.config.vocab_size, (B, T), device=device)
    times = []
    for i in range(warm + steps):
        sync(device)
        t0 = time.perf_counter()
        out = m(input_ids=x)
        loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if i >= warm:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def legorl_step_time(m: torch.nn.Module, B: int, T: int, args: argparse.Namespace) -> tuple[float, dict]:
    cfg = TrainerConfig(
        device=args.device,
        dtype=args.dtype,
        lr=1e-6,
        logprob_chunk=args.chunk,
        master_weights_fp32=args.master_fp32,
        max_tokens_per_microbatch=args.microbatch_tokens,
        experts_implementation=None,
        attn_implementation=m.config._attn_implementation,
    )
    trainer = Trainer(cfg, lm=m)
    trajs = synthetic(m, B, T, seed=0)
    times, metrics = [], {}
    for i in range(args.warm + args.steps):
        sync(args.device)
        t0 = time.perf_counter()
        metrics = trainer.step(trajs)
        sync(args.device)
        if i >= args.warm:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], metrics


def row(
    kind: str, pipeline: str, m: torch.nn.Module, B: int, T: int, t: float, device: str, rss: PeakRss | None = None
) -> dict:
    total, active = active_params(m)
    tok = B * T
    r = {
        "kind": kind,
        "pipeline": pipeline,
        "params_M": round(total / 1e6, 2),
        "active_M": round(active / 1e6, 2),
        "B": B,
        "T": T,
        "step_s": round(t, 4),
        "tokens_per_s": round(tok / t),
    }
    if device.startswith("cuda"):
        flops = 6 * active * tok
        r["mfu_vs_989"] = round(flops / t / 989e12, 4)
        r["mfu_vs_790"] = round(flops / t / 790e12, 4)
        r["peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
        torch.cuda.reset_peak_memory_stats()
    elif rss is not None:
        r.update(rss.fields())
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description="GSPO trainer throughput vs the naive HF step")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", choices=["cpu", "gpu"], default=None)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: fp32 on CPU, bf16 on GPU")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=4096, help="rows per chunk of the LM head")
    ap.add_argument("--microbatch-tokens", type=int, default=16384)
    ap.add_argument("--experts", default="", help="experts_implementation for MoE (e.g. grouped_mm)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--only", default="", help="run only this model's rows (e.g. smollm2-135m-instruct)")
    ap.add_argument("--B", type=int, default=0, help="sequences per step for --only (default: 2 on CPU)")
    ap.add_argument("--T", type=int, default=0, help="tokens per sequence for --only (default: 512 on CPU)")
    ap.add_argument(
        "--master-fp32",
        action="store_true",
        help="bf16 with fp32 master weights (FSDP2 mixed precision, what a real run uses); "
        "default: train the bf16 parameters directly, as the naive probe does",
    )
    args = ap.parse_args()
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
    if args.only:
        models = [(k, f) for k, f in models if k == args.only]
        bundled = [] if models else [args.only]
    for name in bundled:

        def make_bundled(attn: str, name: str = name) -> torch.nn.Module:
            return load_lm(TrainerConfig(model=name, dtype=args.dtype, attn_implementation=attn)).to(args.device)

        models.append((name, make_bundled))
    # the tiny bundled models at a longer sequence; a real vocabulary (SmolLM2: 49k) at the
    # T of a compact agent turn on CPU, at the probe's size on a GPU
    sizes = {"tiny-qwen3": (8, 256), "tiny-qwen3-moe": (8, 256)}
    other = (2, 512) if small else (B, T)
    ours = varlen.register()
    for kind, make in models:
        b, t = (B, T) if kind.startswith("probe") else sizes.get(kind, other)
        b, t = args.B or b, args.T or t
        try:
            m = make("sdpa")
            with PeakRss() as rss:
                t_naive = naive_step_time(m, b, t, args.device, args.steps, args.warm)
            out["rows"].append(row(kind, "naive", m, b, t, t_naive, args.device, rss))
            print(json.dumps(out["rows"][-1]), file=sys.stderr, flush=True)  # progress, if cut short
            del m
            m = make(ours)
            with PeakRss() as rss:
                t_ours, metrics = legorl_step_time(m, b, t, args)
            r = row(kind, "legorl_gspo", m, b, t, t_ours, args.device, rss)
            r["sampled_tokens"] = int(metrics.get("train/sampled_tokens", 0))
            r["speedup_vs_naive"] = round(t_naive / t_ours, 3)
            out["rows"].append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
        except Exception as e:  # one failing size must not hide the others' numbers
            out["rows"].append({"kind": kind, "error": repr(e)[:300]})
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
