"""Recompute log-probabilities of the recorded tokens, memory-lean and at the rollout temperature.

Two choices here shrink rollout/trainer mismatch and memory at once:

- The LM head runs in chunks of rows inside one autograd function: logits for `chunk` rows
  at a time, log-softmax in fp32, only the target's logprob and the entropy kept. The
  backward recomputes each chunk's softmax, so a (tokens × vocabulary) fp32 matrix never
  exists (with a 150k vocabulary and 32k tokens that matrix alone would be ~19 GB).
- `lm_head_fp32` runs the vocabulary projection itself in fp32 (MiniMax-M1 found the bf16 LM
  head to be the main source of mismatch); bench/mismatch.py measures what it buys.

Logits are divided by the sampling temperature before the softmax, because the engine's
logprobs are those of the distribution it sampled from. Rollouts for training must therefore
use top_p = 1 and top_k = -1: with nucleus/top-k sampling the engine reports logprobs
renormalised over the kept tokens (engine/sampling.py), which a full-vocabulary softmax does
not reproduce.

`PolicyModel` wraps the HF causal LM so that one module owns the whole computation: under
FSDP2 the root module's parameters (embeddings, LM head) are gathered for exactly its forward
and backward, which calling the inner decoder directly would bypass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from legorl.packed_families import own_masks, packing_refusal
from legorl.train.batch import MicroBatch
from legorl.train.carried_state import share_alignment
from legorl.train.linear_varlen import segment_aware
from legorl.train.receptive_field import receptive_field
from legorl.train.routing import RoutingRecord, moe_routers, moe_routing
from legorl.train.shared_prefix import (
    DecoderCall,
    PackedCall,
    Span,
    branch_cache,
    checkpointing_refusal,
    prefix_groups,
    shared_hidden,
    sharing_refusal,
)
from legorl.train.varlen import packed_masks, varlen_kwargs


def lm_head_logits(h_C_H: torch.Tensor, w_V_H: torch.Tensor, temperature: float, fp32: bool) -> torch.Tensor:
    """Logits / T in (at least) fp32: projected in fp32 (`fp32`) or in the model dtype then upcast."""
    wide = torch.promote_types(h_C_H.dtype, torch.float32)
    if fp32:
        return (h_C_H.to(wide) @ w_V_H.to(wide).t()) / temperature
    return (h_C_H @ w_V_H.t()).to(wide) / temperature


class _ChunkedLogprobs(torch.autograd.Function):
    """logprob of `targets_N` and entropy under softmax(h Wᵀ / T), chunked over rows."""

    @staticmethod
    def forward(ctx, hidden_N_H, weight_V_H, targets_N, temperature, chunk, fp32):  # type: ignore[override]
        n = hidden_N_H.shape[0]
        wide = torch.promote_types(hidden_N_H.dtype, torch.float32)
        logprobs_N = torch.empty(n, dtype=wide, device=hidden_N_H.device)
        entropy_N = torch.empty(n, dtype=wide, device=hidden_N_H.device)
        w_mm = weight_V_H.to(wide) if fp32 else weight_V_H  # cast once, not per chunk
        for s in range(0, n, chunk):
            z_C_V = lm_head_logits(hidden_N_H[s : s + chunk], w_mm, temperature, fp32)
            logp_C_V = torch.log_softmax(z_C_V, dim=-1)
            logprobs_N[s : s + chunk] = logp_C_V.gather(1, targets_N[s : s + chunk, None]).squeeze(1)
            entropy_N[s : s + chunk] = -(logp_C_V.exp() * logp_C_V).sum(-1)
        ctx.save_for_backward(hidden_N_H, weight_V_H, targets_N)
        ctx.temperature, ctx.chunk, ctx.fp32 = temperature, chunk, fp32
        ctx.mark_non_differentiable(entropy_N)
        return logprobs_N, entropy_N

    @staticmethod
    def backward(ctx, grad_logprobs_N, _grad_entropy_N):  # type: ignore[override]
        hidden_N_H, weight_V_H, targets_N = ctx.saved_tensors
        t, chunk, fp32 = ctx.temperature, ctx.chunk, ctx.fp32
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden_N_H) if need_h else None
        wide = torch.promote_types(hidden_N_H.dtype, torch.float32)
        grad_w = torch.zeros(weight_V_H.shape, dtype=wide, device=weight_V_H.device) if need_w else None
        w_mm = weight_V_H.to(wide) if fp32 else weight_V_H
        for s in range(0, hidden_N_H.shape[0], chunk):
            h_C_H = hidden_N_H[s : s + chunk]
            z_C_V = lm_head_logits(h_C_H, w_mm, t, fp32)
            # d logp_target / d z = onehot(target) - softmax(z); chain through z = h Wᵀ / T
            g_C_V = -torch.softmax(z_C_V, dim=-1)
            g_C_V.scatter_add_(1, targets_N[s : s + chunk, None], torch.ones_like(g_C_V[:, :1]))
            g_C_V *= grad_logprobs_N[s : s + chunk, None].to(wide) / t
            g_mm = g_C_V if fp32 else g_C_V.to(w_mm.dtype)
            if need_h:
                grad_h[s : s + chunk] = (g_mm @ w_mm).to(hidden_N_H.dtype)
            if need_w:
                grad_w += (g_mm.t() @ (h_C_H.to(wide) if fp32 else h_C_H)).to(wide)
        return grad_h, None if grad_w is None else grad_w.to(weight_V_H.dtype), None, None, None, None


def chunked_logprobs(
    hidden_N_H: torch.Tensor,
    weight_V_H: torch.Tensor,
    targets_N: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk: int = 2048,
    fp32: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs_N with gradient, entropy_N detached), both float32 (float64 for float64 inputs)."""
    return _ChunkedLogprobs.apply(hidden_N_H, weight_V_H, targets_N, temperature, chunk, fp32)


Routed = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # hidden, used, natural


@dataclass
class LogprobOptions:
    temperature: float = 1.0
    chunk: int = 2048
    lm_head_fp32: bool = True
    packing: str = "packed"  # or "per_segment", "shared_prefix"
    routing_replay: bool = True
    router_fp32: bool = False


@dataclass
class LogprobOutput:
    logprobs_N: torch.Tensor  # float32, differentiable; 0 where mask_N is 0 (not computed)
    entropy_N: torch.Tensor  # float32, detached; 0 where mask_N is 0
    used_N_L_K: torch.Tensor | None  # experts the forward used (MoE only)
    natural_N_L_K: torch.Tensor | None  # experts the trainer's own routers chose (MoE only)


class PolicyModel(nn.Module):
    """An HF causal LM plus the chunked logprob head: forward(micro-batch) → logprobs, entropy.

    MoE routing is captured on every forward and replayed from `mb.replay_N_L_K` when
    `routing_replay` is on; see routing.py. Linear-attention layers are made segment-aware
    (linear_varlen.py), so packed rows equal per-segment forwards in every layer type.
    """

    def __init__(self, lm: nn.Module, sharded: bool = False) -> None:
        super().__init__()
        self.lm = lm
        self.is_moe = bool(moe_routers(lm))
        self.sharing = sharing_refusal(lm, sharded)  # None: shared-prefix packing is exact here
        self.receptive = receptive_field(lm)  # None: every earlier token can change a logprob
        segment_aware(lm)  # linear-attention layers (Qwen3.5) keep packed segments apart

    def hidden(self, input_ids_B_S: torch.Tensor, position_ids_B_S: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """Decoder output of one row holding segments of `lengths` (varlen kwargs let
        legorl_varlen / flash_attention_2 skip cross-segment attention; sdpa and eager
        derive a block mask from the position-id resets instead, inside the model's forward
        or, for a family whose forward ignores them, here: packed_families.py)."""
        inputs: dict[str, torch.Tensor | dict] = {"input_ids": input_ids_B_S}
        if len(lengths) > 1 and own_masks(self.lm):
            embeds = self.lm.get_input_embeddings()(input_ids_B_S)
            inputs = {"inputs_embeds": embeds, "attention_mask": packed_masks(self.lm.config, embeds, position_ids_B_S)}
        out = self.lm.get_decoder()(
            **inputs,
            position_ids=position_ids_B_S,
            use_cache=False,
            **varlen_kwargs(lengths, input_ids_B_S.device),
        )
        return out.last_hidden_state

    def _hidden_routed(
        self, mb: MicroBatch, start: int, n: int, lengths: list[int], opts: LogprobOptions
    ) -> tuple[torch.Tensor, RoutingRecord | None]:
        ids, pos = mb.input_ids_N[None, start : start + n], mb.position_ids_N[None, start : start + n]
        if not self.is_moe:
            return self.hidden(ids, pos, lengths)[0], None
        replay = None
        if opts.routing_replay and mb.replay_N_L_K is not None:
            replay = mb.replay_N_L_K[start : start + n]
        with moe_routing(self.lm, replay, router_fp32=opts.router_fp32) as record:
            return self.hidden(ids, pos, lengths)[0], record

    def forward(self, mb: MicroBatch, opts: LogprobOptions) -> LogprobOutput:
        align = share_alignment(self.lm.config)
        groups = (
            prefix_groups(mb.input_ids_N, mb.segment_lengths, align=align, pos_N=mb.position_ids_N)
            if opts.packing == "shared_prefix"
            else []
        )
        if groups and self.sharing is None and checkpointing_refusal(self.lm) is None:
            out = shared_hidden(
                self._span_call(opts),
                self._packed_call(mb, opts),
                mb.input_ids_N,
                mb.position_ids_N,
                mb.segment_lengths,
                groups,
                mb.replay_N_L_K if (self.is_moe and opts.routing_replay) else None,
                align,
            )
            return self._head(mb, out.hidden_N_H, opts, out.used_N_L_K, out.natural_N_L_K)
        if opts.packing in ("packed", "shared_prefix"):
            if len(mb.segment_lengths) > 1 and (why := packing_refusal(self.lm)):
                raise ValueError(why)
            spans = [(0, mb.num_tokens, mb.segment_lengths)]
        elif opts.packing == "per_segment":
            starts = [0]
            for n in mb.segment_lengths[:-1]:
                starts.append(starts[-1] + n)
            spans = [(s, n, [n]) for s, n in zip(starts, mb.segment_lengths, strict=True)]
        else:
            raise ValueError(f"unknown packing {opts.packing!r}")
        parts = [self._hidden_routed(mb, s, n, lengths, opts) for s, n, lengths in spans]
        hidden_N_H = torch.cat([h for h, _ in parts]) if len(parts) > 1 else parts[0][0]
        used = natural = None
        if self.is_moe:
            used = torch.cat([r.first_call("used") for _, r in parts])  # type: ignore[union-attr]
            natural = torch.cat([r.first_call("natural") for _, r in parts])  # type: ignore[union-attr]
        return self._head(mb, hidden_N_H, opts, used, natural)

    def _span_call(self, opts: LogprobOptions) -> DecoderCall:
        """One decoder forward on top of a shared prefix's cache (shared-prefix packing)."""
        decoder, config = self.lm.get_decoder(), self.lm.config

        def call(ids: torch.Tensor, pos: torch.Tensor, cache: object | None, replay: torch.Tensor | None) -> Span:
            below = branch_cache(cache, config)
            kwargs = {} if below is None else {"cache": below}
            if not self.is_moe:
                out = decoder(input_ids=ids, position_ids=pos, use_cache=True, **kwargs)
                return out.last_hidden_state[0], out.past_key_values, None, None
            with moe_routing(self.lm, replay, router_fp32=opts.router_fp32) as record:
                out = decoder(input_ids=ids, position_ids=pos, use_cache=True, **kwargs)
            used, natural = record.first_call("used"), record.first_call("natural")
            return out.last_hidden_state[0], out.past_key_values, used, natural

        return call

    def _packed_call(self, mb: MicroBatch, opts: LogprobOptions) -> PackedCall:
        """The segments that share nothing, packed and routed as `packed` would."""

        def call(idx: torch.Tensor, lengths: list[int]) -> Routed:
            ids, pos = mb.input_ids_N[None, idx], mb.position_ids_N[None, idx]
            if not self.is_moe:
                return self.hidden(ids, pos, lengths)[0], None, None
            replay = mb.replay_N_L_K[idx] if (opts.routing_replay and mb.replay_N_L_K is not None) else None
            with moe_routing(self.lm, replay, router_fp32=opts.router_fp32) as record:
                hidden = self.hidden(ids, pos, lengths)[0]
            return hidden, record.first_call("used"), record.first_call("natural")

        return call

    def _head(
        self,
        mb: MicroBatch,
        hidden_N_H: torch.Tensor,
        opts: LogprobOptions,
        used: torch.Tensor | None,
        natural: torch.Tensor | None,
    ) -> LogprobOutput:
        # Only positions whose target the policy sampled need the vocabulary projection:
        # prompt and tool-output tokens (most of an agent trajectory) skip the LM head.
        idx_M = (mb.mask_N > 0).nonzero().squeeze(1)
        weight_V_H = self.lm.get_output_embeddings().weight
        logprobs_M, entropy_M = chunked_logprobs(
            hidden_N_H[idx_M],
            weight_V_H,
            mb.targets_N[idx_M],
            temperature=opts.temperature,
            chunk=opts.chunk,
            fp32=opts.lm_head_fp32,
        )
        logprobs_N = logprobs_M.new_zeros(mb.num_tokens).index_copy(0, idx_M, logprobs_M)
        entropy_N = entropy_M.new_zeros(mb.num_tokens).index_copy(0, idx_M, entropy_M)
        return LogprobOutput(logprobs_N, entropy_N, used, natural)
