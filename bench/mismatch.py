"""Rollout-vs-trainer mismatch of LEGO-RL's pipeline, next to the naive HF anchor.

The models, seeds, sizes and metric definitions of the standard mismatch probe (random
init, lm_head ×40 so distributions are peaked; B×P prompt tokens, T sampled tokens at T=1;
Pearson of token probabilities, |Δlogp|, k3 KL(rollout‖trainer), GSPO sequence ratio, and
the share of (token, MoE layer) pairs whose expert sets differ), so the numbers compare with
an H200 baseline measured the same way. Rows:

- `pipeline = "probe"`  the probe's own method: HF `generate` as the engine, one full HF
  forward as the trainer (an anchor measured on this machine);
- `pipeline = "legorl"` the reference KV-cache sampler as the engine, the trainer's packed
  recompute (legorl_varlen attention, chunked fp32-capable LM head) as the trainer, for each
  precision choice
  (`lm_head_fp32`, `router_fp32`, applied to both sides as a deployment would) and, for
  MoE, routing replay off and on.

    python bench/mismatch.py            # CPU sizes (the probe's small ones)
    python bench/mismatch.py --size gpu # the probe's GPU sizes (H200; not measured here)
    python bench/mismatch.py --family qwen3_moe,qwen3_5_moe,gpt_oss,glm4_moe,qwen3_5

`--family` measures the tiny model of each named architecture family (legorl/model_families.py:
Qwen3.5's Gated-DeltaNet + attention 3:1 with a shared expert, gpt-oss's sinks and sliding
window, GLM-4.5's grouped router, ...; lm_head ×40 as above) instead of the probe's two, and
adds `pipeline = "hf_engine"` rows: the `hf` engine (batched, left-padded, the engine a proxy
serves) as the rollout side, the same packed recompute as the trainer.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from legorl.engine.routing import moe_gates
from legorl.model_families import FAMILIES, TOKENIZER_DIR
from legorl.model_families import build as build_family
from legorl.train import varlen
from legorl.train.batch import pack
from legorl.train.logprobs import LogprobOptions, PolicyModel
from legorl.train.routing import routing_mismatch
from legorl.train.sampler import sample
from legorl.types import AlignmentStats, Segment, Trajectory


def build(kind: str, dtype: torch.dtype, small: bool, device: str) -> tuple[torch.nn.Module, int]:
    """Exactly mismatch_probe.build."""
    torch.manual_seed(0)
    if kind == "moe":
        cfg = AutoConfig.for_model(
            "qwen3_moe",
            vocab_size=32000,
            hidden_size=256 if small else 1024,
            intermediate_size=512 if small else 2048,
            moe_intermediate_size=128 if small else 512,
            num_hidden_layers=2 if small else 12,
            num_attention_heads=4 if small else 16,
            num_key_value_heads=2 if small else 4,
            head_dim=64,
            num_experts=16 if small else 64,
            num_experts_per_tok=4 if small else 8,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            max_position_embeddings=4096,
            output_router_logits=False,
            tie_word_embeddings=False,
        )
    else:
        cfg = AutoConfig.for_model(
            "qwen3",
            vocab_size=32000,
            hidden_size=256 if small else 1024,
            intermediate_size=512 if small else 3072,
            num_hidden_layers=2 if small else 16,
            num_attention_heads=4 if small else 16,
            num_key_value_heads=2 if small else 8,
            head_dim=64,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        )
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        m.lm_head.weight.mul_(40.0)
    return m.to(device, dtype=dtype).eval(), sum(p.numel() for p in m.parameters())


def summarise(roll_lp: torch.Tensor, tr_lp: torch.Tensor, lengths: list[int]) -> dict[str, float]:
    """The probe's metrics (plus |Δp|), over sampled tokens; `lengths` splits them into sequences."""
    pr, pt = roll_lp.double().exp(), tr_lp.double().exp()
    d = (roll_lp.double() - tr_lp.double()).abs()
    delta = tr_lp.double() - roll_lp.double()
    seq = torch.stack([s.mean() for s in delta.split(lengths)]).exp()
    return {
        "tokens": int(roll_lp.numel()),
        "prob_pearson": round(float(torch.corrcoef(torch.stack([pr, pt]))[0, 1]), 6),
        "mean_abs_dlogp": sig(d.mean()),
        "max_abs_dlogp": sig(d.max()),
        "mean_abs_dp": sig((pt - pr).abs().mean()),
        "max_abs_dp": sig((pt - pr).abs().max()),
        "k3_kl": sig((delta.exp() - 1 - delta).mean()),
        "seq_ratio_min": round(float(seq.min()), 5),
        "seq_ratio_max": round(float(seq.max()), 5),
        "mean_token_prob": round(float(pr.mean()), 4),
    }


def sig(x: torch.Tensor | float) -> float:
    """4 significant digits (the probe rounds to fixed decimals, which hides fp32 values)."""
    return float(f"{float(x):.4g}")


def probe_row(m: torch.nn.Module, kind: str, B: int, P: int, T: int, device: str) -> dict:
    """mismatch_probe.run, condensed: HF generate vs one full forward."""
    gates = moe_gates(m) if kind == "moe" else []
    calls: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(gates))}
    hooks = [
        gt.register_forward_hook(lambda mod, a, o, i=i: calls[i].append(o[2].detach().cpu()))
        for i, gt in enumerate(gates)
    ]
    g = torch.Generator(device="cpu").manual_seed(1)
    vocab = m.get_input_embeddings().weight.shape[0]
    prompt = torch.randint(0, vocab, (B, P), generator=g).to(device)
    torch.manual_seed(2)
    with torch.no_grad():
        gen = m.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=T,
            min_new_tokens=T,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    seq, comp = gen.sequences, gen.sequences[:, P:]
    roll_lp = torch.log_softmax(torch.stack(gen.logits, 1).float(), -1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)
    roll_route = {i: list(c) for i, c in calls.items()}
    for c in calls.values():
        c.clear()
    with torch.no_grad():
        tr_lp = torch.log_softmax(m(seq).logits[:, P - 1 : -1].float(), -1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)
    row = summarise(roll_lp.flatten().cpu(), tr_lp.flatten().cpu(), [T] * B)
    row["route_mismatch"] = None
    if gates:
        diff = tot = 0
        for i in calls:
            k = calls[i][0].shape[-1]
            full = calls[i][0].view(B, -1, k)
            roll = torch.cat(
                [roll_route[i][0].view(B, P, k), torch.stack([x.view(B, k) for x in roll_route[i][1:]], 1)], 1
            )
            a, b = full[:, : roll.shape[1]].sort(-1).values, roll.sort(-1).values
            diff += int((a != b).any(-1).sum())
            tot += a.shape[0] * a.shape[1]
        row["route_mismatch"] = round(diff / tot, 5)
    for h in hooks:
        h.remove()
    return row


def legorl_rows(m: torch.nn.Module, kind: str, dtype: torch.dtype, B: int, P: int, T: int, device: str) -> list[dict]:
    variants = [(True, False)] if dtype == torch.float32 else [(False, False), (True, False), (True, True)]
    if kind == "dense":
        variants = sorted({(head, False) for head, _ in variants})
    rows = []
    g = torch.Generator(device="cpu").manual_seed(1)
    prompts = torch.randint(0, m.get_input_embeddings().weight.shape[0], (B, P), generator=g).tolist()
    for head_fp32, router_fp32 in variants:
        torch.manual_seed(2)
        t0 = time.perf_counter()
        samples = sample(m, prompts, max_new_tokens=T, temperature=1.0, lm_head_fp32=head_fp32, router_fp32=router_fp32)
        gen_s = time.perf_counter() - t0
        trajs = []
        for i, s in enumerate(samples):
            n = len(s.completion_ids)
            seg = Segment(
                [0], prompts[i] + s.completion_ids, [0] * P + [1] * n, [0.0] * P + s.logprobs, [0], s.routed_experts
            )
            trajs.append(Trajectory(f"r{i}", [seg], AlignmentStats(), instance_id="t"))
        for row in trainer_rows(m, kind, trajs, head_fp32, router_fp32, device):
            row["gen_tok_per_s"] = round(B * T / gen_s, 1)
            rows.append(row)
    return rows


def trainer_rows(
    m: torch.nn.Module, kind: str, trajs: list[Trajectory], head_fp32: bool, router_fp32: bool, device: str
) -> list[dict]:
    """The trainer's packed recompute of recorded trajectories, replay off and on (MoE)."""
    rows = []
    (mb,) = pack([(i, t, 1.0) for i, t in enumerate(trajs)], "trajectory", 1 << 30)
    lengths = [sum(t.segments[0].loss_mask) for t in trajs]
    for replay in [False, True] if kind == "moe" else [False]:
        opts = LogprobOptions(temperature=1.0, lm_head_fp32=head_fp32, router_fp32=router_fp32, routing_replay=replay)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = PolicyModel(m)(mb.to(device), opts)
        fwd_s = time.perf_counter() - t0
        sel = mb.mask_N > 0
        row = {
            "lm_head_fp32": head_fp32,
            "router_fp32": router_fp32 if kind == "moe" else None,
            "replay": replay if kind == "moe" else None,
        }
        row.update(summarise(mb.rollout_logprobs_N[sel], out.logprobs_N.cpu()[sel], lengths))
        row["route_mismatch"] = None
        if out.used_N_L_K is not None:
            valid = (mb.replay_N_L_K >= 0).all(-1).all(-1)
            used, tot = routing_mismatch(out.used_N_L_K.cpu(), mb.replay_N_L_K, valid)
            nat, _ = routing_mismatch(out.natural_N_L_K.cpu(), mb.replay_N_L_K, valid)
            row["route_mismatch"] = round(used / tot, 5)
            row["router_disagreement"] = round(nat / tot, 5)
        row["fwd_s"] = round(fwd_s, 3)
        rows.append(row)
    return rows


def engine_rows(m: torch.nn.Module, kind: str, dtype: torch.dtype, B: int, P: int, T: int, device: str) -> list[dict]:
    """The `hf` engine as the rollout side (B concurrent requests, left-padded batches), the
    trainer's packed recompute as the other; the engine loads the same weights from disk."""
    import asyncio
    import shutil
    import tempfile

    from legorl.engine.hf import HFEngine
    from legorl.types import SamplingParams

    g = torch.Generator().manual_seed(1)
    vocab = m.get_input_embeddings().weight.shape[0]
    prompts = [torch.randint(3, vocab, (P - (i % 3),), generator=g).tolist() for i in range(B)]  # unequal: padding
    with tempfile.TemporaryDirectory() as tmp:
        m.save_pretrained(tmp, safe_serialization=True)
        for f in TOKENIZER_DIR.iterdir():
            if f.name.startswith("tokenizer"):
                shutil.copy(f, f"{tmp}/{f.name}")

        async def run() -> tuple[list, float]:
            engine = HFEngine(tmp, device=device, dtype=str(dtype).split(".")[-1], seed=2)
            try:
                params = SamplingParams(temperature=1.0, max_tokens=T, seed=None)
                t0 = time.perf_counter()
                gens = await asyncio.gather(*[engine.generate(p, params) for p in prompts])
                return gens, time.perf_counter() - t0
            finally:
                await engine.close()

        gens, gen_s = asyncio.run(run())
    trajs = []
    for i, (p, gen) in enumerate(zip(prompts, gens, strict=True)):
        n = len(gen.completion_ids)
        seg = Segment(
            [0], p + gen.completion_ids, [0] * len(p) + [1] * n, [0.0] * len(p) + gen.logprobs, [0], gen.routed_experts
        )
        trajs.append(Trajectory(f"e{i}", [seg], AlignmentStats(), instance_id="t"))
    rows = trainer_rows(m, kind, trajs, True, False, device)
    for row in rows:
        row["gen_tok_per_s"] = round(sum(len(x.completion_ids) for x in gens) / gen_s, 1)
    return rows


def family_model(family: str, dtype: torch.dtype, device: str) -> tuple[torch.nn.Module, int]:
    """The tiny model of an architecture family, lm_head ×40 as in `build`."""
    m = build_family(family)
    with torch.no_grad():
        m.get_output_embeddings().weight.mul_(40.0)
    return m.to(device, dtype=dtype).eval(), sum(p.numel() for p in m.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description="rollout/trainer mismatch, dense and MoE, fp32 and bf16")
    ap.add_argument("--size", choices=["cpu", "gpu"], default=None, help="model sizes (default: by device)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--skip-probe", action="store_true", help="only the legorl rows")
    ap.add_argument("--kinds", default="dense,moe")
    ap.add_argument("--family", default="", help=f"comma-separated families instead of --kinds: {', '.join(FAMILIES)}")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--bpt", default="", help="override batch,prompt_len,new_tokens (e.g. 4,64,128)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    small = (args.size or ("cpu" if args.device == "cpu" else "gpu")) == "cpu"
    B, P, T = (2, 16, 24) if small else (16, 128, 512)
    if args.bpt:
        B, P, T = (int(x) for x in args.bpt.split(","))
    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": args.device,
        "size": "cpu" if small else "gpu",
        "B": B,
        "P": P,
        "T": T,
        "rows": [],
    }
    if args.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name()
    models = args.family.split(",") if args.family else args.kinds.split(",")
    for name in models:
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            if args.family:
                m, nparams = family_model(name, dtype, args.device)
                kind = "moe" if moe_gates(m) else "dense"
                base = {
                    "family": name,
                    "kind": kind,
                    "dtype": str(dtype).split(".")[-1],
                    "params_M": round(nparams / 1e6, 2),
                }
            else:
                kind = name
                m, nparams = build(kind, dtype, small, args.device)
                base = {"kind": kind, "dtype": str(dtype).split(".")[-1], "params_M": round(nparams / 1e6, 1)}
            if not args.skip_probe:
                out["rows"].append({**base, "pipeline": "probe", **probe_row(m, kind, B, P, T, args.device)})
            m.set_attn_implementation(varlen.register())  # the trainer's default kernel
            for row in legorl_rows(m, kind, dtype, B, P, T, args.device):
                out["rows"].append({**base, "pipeline": "legorl", **row})
            if args.family:
                for row in engine_rows(m, kind, dtype, B, P, T, args.device):
                    out["rows"].append({**base, "pipeline": "hf_engine", **row})
            del m
    print(json.dumps(out))


if __name__ == "__main__":
    main()
