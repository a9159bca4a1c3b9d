"""Policy-gradient losses as pure functions over packed token tensors.

Layout: a micro-batch is N packed token positions. `mask_N` is 1 where the token was sampled
by the policy (the only tokens that carry loss), `unit_ids_N` in [0, U) names the "sequence"
each token belongs to (a trajectory, segment or turn: `TrainerConfig.sequence_unit`), and
every unit lies wholly inside one micro-batch, so per-unit statistics are exact locally.

Aggregation is always named (`aggregation=`) and normalised by *global* counts (`Normalizer`)
so that summing the losses of all micro-batches and all data-parallel ranks gives the loss of
the whole batch, whatever the split:

- `seq_mean_token_mean`  Σ_u (Σ_{t∈u} L_t / n_u) / U          GRPO, GSPO (verl forces this)
- `token_mean`           Σ_t L_t / N_tokens                    DAPO
- `seq_mean_token_sum`   Σ_u Σ_{t∈u} L_t / U
- `token_sum_norm`       Σ_t L_t / (U · norm_tokens)            Dr.GRPO (TRL's dr_grpo)

Ratios are clamped to exp(±20) before exponentiation (as verl does) so that a corrupt logprob
cannot produce inf; with sane inputs the clamp is never active.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from legorl.train.config import Aggregation

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class Normalizer:
    """Global denominators of the batch: sampled tokens and non-empty units over every
    micro-batch and rank, plus Dr.GRPO's constant."""

    tokens: float
    units: float
    norm_tokens: float = 1.0


@dataclass
class LossMetrics:
    """Detached statistics of one loss call, mergeable across micro-batches."""

    tokens: float = 0.0
    clipped_tokens: float = 0.0
    units: float = 0.0
    seq_ratio_sum: float = 0.0
    seq_ratio_min: float = float("inf")
    seq_ratio_max: float = float("-inf")

    @classmethod
    def merge(cls, parts: Sequence[LossMetrics]) -> LossMetrics:
        out = cls()
        for p in parts:
            out.tokens += p.tokens
            out.clipped_tokens += p.clipped_tokens
            out.units += p.units
            out.seq_ratio_sum += p.seq_ratio_sum
            out.seq_ratio_min = min(out.seq_ratio_min, p.seq_ratio_min)
            out.seq_ratio_max = max(out.seq_ratio_max, p.seq_ratio_max)
        return out

    def as_dict(self) -> dict[str, float]:
        has = self.units > 0
        return {
            "train/clip_frac": self.clipped_tokens / self.tokens if self.tokens else 0.0,
            "train/seq_ratio_min": self.seq_ratio_min if has else 1.0,
            "train/seq_ratio_mean": self.seq_ratio_sum / self.units if has else 1.0,
            "train/seq_ratio_max": self.seq_ratio_max if has else 1.0,
        }


def unit_sum(values_N: torch.Tensor, unit_ids_N: torch.Tensor, num_units: int) -> torch.Tensor:
    """Σ of values per unit, differentiable; (U,)."""
    out_U = torch.zeros(num_units, dtype=values_N.dtype, device=values_N.device)
    return out_U.index_add(0, unit_ids_N, values_N)


def aggregate(
    loss_N: torch.Tensor,
    mask_N: torch.Tensor,
    unit_ids_N: torch.Tensor,
    num_units: int,
    aggregation: Aggregation,
    norm: Normalizer,
) -> torch.Tensor:
    """Reduce per-token losses to one scalar (see the module docstring for the formulas)."""
    masked_N = loss_N * mask_N
    if aggregation == "token_mean":
        return masked_N.sum() / max(norm.tokens, 1.0)
    if aggregation == "token_sum_norm":
        return masked_N.sum() / (max(norm.units, 1.0) * norm.norm_tokens)
    per_unit_U = unit_sum(masked_N, unit_ids_N, num_units)
    if aggregation == "seq_mean_token_mean":
        per_unit_U = per_unit_U / unit_sum(mask_N, unit_ids_N, num_units).clamp(min=1.0)
    elif aggregation != "seq_mean_token_sum":
        raise ValueError(f"unknown aggregation {aggregation!r}")
    return per_unit_U.sum() / max(norm.units, 1.0)


def _clipped_objective(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """-min(r·A, clip(r)·A) and where the clipped branch is the active (gradient-free) one."""
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    unclipped, clipped = ratio * adv, clipped_ratio * adv
    active = (clipped < unclipped).detach()
    return -torch.minimum(unclipped, clipped), active


def _token_objective(
    log_ratio_N: torch.Tensor,
    advantages_N: torch.Tensor,
    weights_N: torch.Tensor | None,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped objective of token-level ratios exp(log_ratio_N), times the (detached)
    correction weights: GRPO and GSPO-token differ only in how they build log_ratio_N."""
    ratio_N = log_ratio_N.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    loss_N, active_N = _clipped_objective(ratio_N, advantages_N, clip_low, clip_high)
    if weights_N is not None:
        loss_N = loss_N * weights_N.detach()
    return loss_N, active_N


def _seq_log_ratio_U(
    logprobs_N: torch.Tensor,
    old_logprobs_N: torch.Tensor,
    mask_N: torch.Tensor,
    unit_ids_N: torch.Tensor,
    num_units: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """mean over each unit's sampled tokens of (logp - logp_old), and the token counts."""
    count_U = unit_sum(mask_N, unit_ids_N, num_units)
    delta_U = unit_sum((logprobs_N - old_logprobs_N) * mask_N, unit_ids_N, num_units)
    return delta_U / count_U.clamp(min=1.0), count_U


def _metrics(
    seq_log_ratio_U: torch.Tensor, count_U: torch.Tensor, active_N: torch.Tensor, mask_N: torch.Tensor
) -> LossMetrics:
    seq_ratio_U = seq_log_ratio_U.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    live_U = count_U > 0
    live = seq_ratio_U[live_U]
    return LossMetrics(
        tokens=float(mask_N.sum()),
        clipped_tokens=float((active_N.to(mask_N.dtype) * mask_N).sum()),
        units=float(live_U.sum()),
        seq_ratio_sum=float(live.sum()),
        seq_ratio_min=float(live.min()) if live.numel() else float("inf"),
        seq_ratio_max=float(live.max()) if live.numel() else float("-inf"),
    )


def gspo_loss(
    logprobs_N: torch.Tensor,
    old_logprobs_N: torch.Tensor,
    advantages_N: torch.Tensor,
    mask_N: torch.Tensor,
    unit_ids_N: torch.Tensor,
    num_units: int,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    weights_N: torch.Tensor | None = None,
    aggregation: Aggregation = "seq_mean_token_mean",
    norm: Normalizer,
) -> tuple[torch.Tensor, LossMetrics]:
    """GSPO: one length-normalised ratio s_u = exp(mean_t(logp - logp_old)) per unit.

    L_u = -w̄_u · min(s_u·Â_u, clip(s_u, 1-ε_low, 1+ε_high)·Â_u), where Â_u and w̄_u are the
    unit's mean advantage and mean correction weight over its sampled tokens (constant per
    unit for outcome rewards and sequence-level correction). Every token of the unit carries
    L_u before aggregation, so seq_mean_token_mean gives the paper's mean over sequences.
    The gradient reaches every token through s_u: ∇s_u = s_u · mean_t ∇logp_t.
    """
    seq_log_ratio_U, count_U = _seq_log_ratio_U(logprobs_N, old_logprobs_N, mask_N, unit_ids_N, num_units)
    ratio_U = seq_log_ratio_U.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    denom_U = count_U.clamp(min=1.0)
    adv_U = unit_sum(advantages_N * mask_N, unit_ids_N, num_units) / denom_U
    loss_U, active_U = _clipped_objective(ratio_U, adv_U, clip_low, clip_high)
    if weights_N is not None:
        loss_U = loss_U * (unit_sum(weights_N.detach() * mask_N, unit_ids_N, num_units) / denom_U)
    loss_N = loss_U[unit_ids_N]
    loss = aggregate(loss_N, mask_N, unit_ids_N, num_units, aggregation, norm)
    return loss, _metrics(seq_log_ratio_U, count_U, active_U[unit_ids_N], mask_N)


def gspo_token_loss(
    logprobs_N: torch.Tensor,
    old_logprobs_N: torch.Tensor,
    advantages_N: torch.Tensor,
    mask_N: torch.Tensor,
    unit_ids_N: torch.Tensor,
    num_units: int,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    weights_N: torch.Tensor | None = None,
    aggregation: Aggregation = "seq_mean_token_mean",
    norm: Normalizer,
) -> tuple[torch.Tensor, LossMetrics]:
    """GSPO-token: s_{u,t} = sg[s_u] · π(y_t)/sg[π(y_t)], per-token advantage and weight.

    Numerically s_{u,t} = s_u; its gradient is s_u·∇logp_t. Identical to GSPO when the
    advantage and weight are constant per unit; differs when they vary per token (e.g.
    turn-level credit or token-level IS correction).
    """
    seq_log_ratio_U, count_U = _seq_log_ratio_U(logprobs_N.detach(), old_logprobs_N, mask_N, unit_ids_N, num_units)
    log_ratio_N = logprobs_N - logprobs_N.detach() + seq_log_ratio_U[unit_ids_N]
    loss_N, active_N = _token_objective(log_ratio_N, advantages_N, weights_N, clip_low, clip_high)
    loss = aggregate(loss_N, mask_N, unit_ids_N, num_units, aggregation, norm)
    return loss, _metrics(seq_log_ratio_U, count_U, active_N, mask_N)


def grpo_loss(
    logprobs_N: torch.Tensor,
    old_logprobs_N: torch.Tensor,
    advantages_N: torch.Tensor,
    mask_N: torch.Tensor,
    unit_ids_N: torch.Tensor,
    num_units: int,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    weights_N: torch.Tensor | None = None,
    aggregation: Aggregation = "seq_mean_token_mean",
    norm: Normalizer,
) -> tuple[torch.Tensor, LossMetrics]:
    """GRPO/PPO clip on the token ratio r_t = π(y_t)/π_old(y_t), no KL term (β = 0).

    The default clip pair is DAPO's "clip-higher" (0.2, 0.28). The sequence ratio in the
    metrics is the same geometric mean GSPO uses, for comparable dashboards.
    """
    seq_log_ratio_U, count_U = _seq_log_ratio_U(logprobs_N.detach(), old_logprobs_N, mask_N, unit_ids_N, num_units)
    loss_N, active_N = _token_objective(logprobs_N - old_logprobs_N, advantages_N, weights_N, clip_low, clip_high)
    loss = aggregate(loss_N, mask_N, unit_ids_N, num_units, aggregation, norm)
    return loss, _metrics(seq_log_ratio_U, count_U, active_N, mask_N)


def k3_kl_N(logprobs_N: torch.Tensor, ref_logprobs_N: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π‖π_ref) on tokens sampled from π: r - log r - 1 with
    r = π_ref/π. It is non-negative, unbiased for the KL, and 0 exactly where the two agree
    (Schulman's estimator; GRPO's β term). Its gradient, (1 - r)·∇log π, pulls each sampled
    token's probability back toward the reference's."""
    log_r_N = (ref_logprobs_N - logprobs_N).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_r_N.exp() - log_r_N - 1.0


# Dr.GRPO: GRPO's token objective without length normalisation per sequence, Σ_t L_t /
# (U · norm_tokens), so a long answer's tokens weigh as much as a short one's; pair with
# advantages that are not divided by the group std (the config default). Only the default
# aggregation differs from GRPO.
dr_grpo_loss = functools.partial(grpo_loss, aggregation="token_sum_norm")

LOSSES: dict[str, Callable[..., tuple[torch.Tensor, LossMetrics]]] = {
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
    "grpo": grpo_loss,
    "dr_grpo": dr_grpo_loss,
}
