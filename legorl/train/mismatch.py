"""Rollout-vs-trainer mismatch: the metrics that expose it and the IS corrections that bound it.

Metrics use verl's definitions, so numbers compare with published ones:
Pearson correlation of token *probabilities* exp(logp) pooled over sampled tokens, mean/max
|Δp| and |Δlogp|, and the k3 estimator of KL(rollout ‖ trainer), mean(e^δ − 1 − δ) with
δ = logp_trainer − logp_rollout (≥ 0, unbiased, low variance).

Corrections reweight each token's loss by ρ = π_old / π_rollout (π_old: the trainer's
recomputation before the update):
- TIS  w = min(ρ, C)                      (Yao et al.; verl `rollout_is`, slime `--use-tis`)
- MIS  w = ρ if low ≤ ρ ≤ high else 0     (IcePop / masked IS: drop the toxic tail)
at the level of a token (ρ_t), a sequence unit (ρ_u = Π_t ρ_t, unbiased but high variance
on long trajectories) or a unit's geometric mean (exp(mean_t log ρ_t), the scale of GSPO's
own ratio). Weights are detached: they scale gradients, they are not optimised.
"""

from __future__ import annotations

import torch

from legorl.train.config import Correction, CorrectionLevel
from legorl.train.losses import LOG_RATIO_CLAMP, unit_sum


class MismatchStats:
    """Accumulates sufficient statistics over micro-batches (and ranks, via `tensor()`)."""

    FIELDS = ("n", "sx", "sy", "sxx", "syy", "sxy", "sum_abs_dp", "sum_abs_dlogp", "sum_k3")

    def __init__(self) -> None:
        self.sums = torch.zeros(len(self.FIELDS), dtype=torch.float64)
        self.max_abs_dp = 0.0
        self.max_abs_dlogp = 0.0

    def add(self, trainer_logprobs_N: torch.Tensor, rollout_logprobs_N: torch.Tensor, mask_N: torch.Tensor) -> None:
        sel = mask_N > 0
        t = trainer_logprobs_N.detach()[sel].double().cpu()
        r = rollout_logprobs_N.detach()[sel].double().cpu()
        if t.numel() == 0:
            return
        pt, pr = t.exp(), r.exp()
        delta = t - r
        self.sums += torch.stack(
            [
                torch.tensor(float(t.numel()), dtype=torch.float64),
                pr.sum(),
                pt.sum(),
                (pr * pr).sum(),
                (pt * pt).sum(),
                (pr * pt).sum(),
                (pt - pr).abs().sum(),
                delta.abs().sum(),
                (delta.exp() - 1 - delta).sum(),
            ]
        )
        self.max_abs_dp = max(self.max_abs_dp, float((pt - pr).abs().max()))
        self.max_abs_dlogp = max(self.max_abs_dlogp, float(delta.abs().max()))

    def metrics(self) -> dict[str, float]:
        n, sx, sy, sxx, syy, sxy, adp, adl, k3 = self.sums.tolist()
        if n == 0:
            return {}
        cov = sxy / n - (sx / n) * (sy / n)
        vx, vy = sxx / n - (sx / n) ** 2, syy / n - (sy / n) ** 2
        pearson = cov / (vx * vy) ** 0.5 if vx > 0 and vy > 0 else float("nan")
        return {
            "mismatch/pearson": pearson,
            "mismatch/mean_abs_dp": adp / n,
            "mismatch/max_abs_dp": self.max_abs_dp,
            "mismatch/mean_abs_dlogp": adl / n,
            "mismatch/max_abs_dlogp": self.max_abs_dlogp,
            "mismatch/k3_kl": k3 / n,
        }


def mismatch_metrics(
    trainer_logprobs_N: torch.Tensor, rollout_logprobs_N: torch.Tensor, mask_N: torch.Tensor
) -> dict[str, float]:
    """One-shot version of `MismatchStats` for a single tensor pair."""
    stats = MismatchStats()
    stats.add(trainer_logprobs_N, rollout_logprobs_N, mask_N)
    return stats.metrics()


def correction_weights(
    old_logprobs_N: torch.Tensor,
    rollout_logprobs_N: torch.Tensor,
    mask_N: torch.Tensor,
    unit_ids_N: torch.Tensor,
    num_units: int,
    *,
    mode: Correction,
    level: CorrectionLevel = "token",
    tis_cap: float = 2.0,
    mis_low: float = 0.5,
    mis_high: float = 2.0,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Detached per-token weights (None for mode 'none') and their statistics.

    `tokens` in the statistics is the number of sampled tokens; `rejected` counts sampled
    tokens whose weight MIS set to 0 and `truncated` those TIS capped.
    """
    if mode == "none":
        return None, {}
    log_rho_N = ((old_logprobs_N.detach() - rollout_logprobs_N) * mask_N).float()
    if level == "token":
        lr_N = log_rho_N
    else:
        sum_U = unit_sum(log_rho_N, unit_ids_N, num_units)
        if level == "geometric":
            sum_U = sum_U / unit_sum(mask_N.float(), unit_ids_N, num_units).clamp(min=1.0)
        elif level != "sequence":
            raise ValueError(f"unknown correction level {level!r}")
        lr_N = sum_U[unit_ids_N]
    rho_N = lr_N.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    sel = mask_N > 0
    if mode == "tis":
        weights_N = rho_N.clamp(max=tis_cap)
        changed = (rho_N > tis_cap) & sel
        key = "truncated"
    elif mode == "mis":
        keep = (rho_N >= mis_low) & (rho_N <= mis_high)
        weights_N = torch.where(keep, rho_N, torch.zeros_like(rho_N))
        changed = ~keep & sel
        key = "rejected"
    else:
        raise ValueError(f"unknown correction mode {mode!r}")
    weights_N = weights_N * mask_N
    stats = {
        "tokens": float(sel.sum()),
        key: float(changed.sum()),
        "weight_sum": float(weights_N[sel].sum()),
        "rho_max": float(rho_N[sel].max()) if bool(sel.any()) else 1.0,
        "rho_min": float(rho_N[sel].min()) if bool(sel.any()) else 1.0,
    }
    return weights_N.detach(), stats
