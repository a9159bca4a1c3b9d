"""The trainer: one call of `step(trajectories)` is one batch of GSPO (or GRPO) updates.

A step: group-normalised advantages (infra errors left out) → pack recorded token ids into
micro-batches → recompute logprobs (routing replayed, chunked fp32 LM head, rollout
temperature) → π_old (own recomputation, or the rollout's) → optional TIS/MIS weights →
loss (globally normalised, so micro-batches and ranks just add up) → backward → clip →
AdamW → scheduler. `minibatches > 1` splits the batch into that many optimizer steps (the
GSPO paper uses 4) with π_old computed once, before the first.

After the step the policy version is +1; `await sync_weights()` pushes the new weights to
the engines (`sync.py`) and `await train_step(...)` does both. Checkpoints are written every
`checkpoint_every` steps and restore exactly (`checkpoint.py`).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from legorl.compute_thread import in_own_thread
from legorl.config import ConfigError
from legorl.packed_families import packing_refusal
from legorl.train import checkpoint as ckpt
from legorl.train.activations import wants_checkpointing
from legorl.train.advantages import Advantages, compute_advantages
from legorl.train.batch import MicroBatch, count_units, pack, split_balanced
from legorl.train.config import TrainerConfig
from legorl.train.fsdp import DistInfo, all_reduce_, full_state_dict, init_distributed, shard
from legorl.train.kept_logprobs import KeptLogprobs
from legorl.train.logprobs import LogprobOptions, PolicyModel
from legorl.train.losses import LOSSES, LossMetrics, Normalizer, aggregate, k3_kl_N
from legorl.train.mismatch import MismatchStats, correction_weights
from legorl.train.routing import moe_routers, moe_routing, routing_mismatch
from legorl.train.schedule import warmup_cosine_lr
from legorl.train.sft import SFTConfig, sft
from legorl.train.shared_prefix import CHECKPOINTING_REFUSAL
from legorl.train.sync import WeightSync
from legorl.types import Trajectory

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_lm(cfg: TrainerConfig, dtype: torch.dtype | None = None) -> nn.Module:
    """The HF causal LM named by the config, in train mode on the CPU."""
    import transformers
    from transformers import AutoModelForCausalLM

    from legorl.models import resolve_model
    from legorl.train import varlen

    varlen.register()
    kwargs: dict[str, Any] = {"dtype": dtype or DTYPES[cfg.dtype], "attn_implementation": cfg.attn_implementation}
    if cfg.experts_implementation:
        kwargs["experts_implementation"] = cfg.experts_implementation
    transformers.utils.logging.disable_progress_bar()
    lm = AutoModelForCausalLM.from_pretrained(resolve_model(cfg.model), **kwargs)
    lm.config.use_cache = False
    return lm.train()


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class WeightsSnapshot:
    """A trainer's weights and optimizer state at one moment (`Trainer.snapshot`): what the
    control phase goes back to after GSPO has moved on from the warm start."""

    lm: dict[str, torch.Tensor]
    optimizer: dict[str, Any]


class Trainer:
    def __init__(
        self,
        cfg: TrainerConfig,
        *,
        lm: nn.Module | None = None,
        weight_sync: WeightSync | None = None,
    ) -> None:
        self.cfg = cfg.resolved()
        c = self.cfg
        mixed = c.dtype == "bfloat16" and c.master_weights_fp32
        self.dist: DistInfo = init_distributed(c.device, single=mixed)
        self.device = torch.device(f"cuda:{self.dist.local_rank}" if c.device == "cuda" else c.device)
        seed_everything(c.seed)
        sharded = self.dist.enabled
        # under FSDP keep fp32 master weights and compute in bf16 (see fsdp.py)
        self.lm = lm if lm is not None else load_lm(c, torch.float32 if sharded else None)
        if mixed and lm is not None:
            self.lm = self.lm.float()
        setting = c.gradient_checkpointing
        if setting == "auto" and c.packing == "per_segment" and moe_routers(self.lm):
            setting = False  # "auto" never turns on what an MoE model cannot do per segment (below)
        self.checkpointing = wants_checkpointing(setting, self.lm, c.max_tokens_per_microbatch, c.activation_budget_gb)
        if self.checkpointing:
            log.info("[trainer] gradient checkpointing on (%s)", c.gradient_checkpointing)
            enable = getattr(self.lm, "activation_checkpointing_enable", None)  # transformers >= 5.2x
            if enable is not None:
                enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if c.packing in ("packed", "shared_prefix") and (why := packing_refusal(self.lm)):
            raise ConfigError(f"[trainer] {why}")
        self.policy = PolicyModel(self.lm, sharded=self.dist.world > 1).to(self.device)
        if c.kl_coef > 0 and self.dist.world > 1:
            raise ConfigError("[trainer] kl_coef > 0 needs one trainer process: the reference policy is not sharded")
        self.reference: PolicyModel | None = None  # π_ref of the KL penalty (set_reference)
        if c.packing == "shared_prefix" and (
            why := self.policy.sharing or (CHECKPOINTING_REFUSAL if self.checkpointing else None)
        ):
            log.warning("[trainer] %s", why)
        if self.policy.receptive is not None:
            log.info(
                "[trainer] every layer is windowed: tokens over %d before a segment's first sampled one "
                "are not computed (receptive_field.py)",
                self.policy.receptive,
            )
        if self.policy.is_moe and self.checkpointing and c.packing == "per_segment":
            raise ValueError(
                "gradient_checkpointing on an MoE model needs packing = 'packed' (routing replay in backward)"
            )
        if sharded:
            compute = torch.bfloat16 if c.dtype == "bfloat16" else None
            shard(self.policy, list(self.lm.get_decoder().layers), compute_dtype=compute)
        fused = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(),
            lr=c.lr,
            betas=c.betas,
            eps=c.adam_eps,
            weight_decay=c.weight_decay,
            fused=fused or None,
            foreach=None if fused else True,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.opts = LogprobOptions(
            temperature=c.temperature,
            chunk=c.logprob_chunk,
            lm_head_fp32=c.lm_head_fp32,
            packing=c.packing,
            routing_replay=c.routing_replay,
            router_fp32=c.router_fp32,
        )
        self.weight_sync = weight_sync
        self.step_count = 0  # batches trained
        self.version = 0  # policy version of the current weights (+1 per step)
        self.data_state: dict[str, Any] = {}
        self.kept_logprobs: KeptLogprobs | None = None  # the last step's, with `step(keep_logprobs=n)`

    def _lr_factor(self, opt_step: int) -> float:
        c = self.cfg
        if c.schedule == "cosine":
            return warmup_cosine_lr(1.0, opt_step, c.warmup_steps, c.total_steps)
        if opt_step < c.warmup_steps:
            return (opt_step + 1) / c.warmup_steps
        return 1.0

    # ---- one step ---------------------------------------------------------------------

    def advantages(self, trajectories: Sequence[Trajectory]) -> Advantages:
        """Group-normalised advantages of a batch, as this trainer's config computes them."""
        c = self.cfg
        return compute_advantages(
            trajectories,
            scale_by_std=bool(c.scale_advantage_by_std),
            eps=c.advantage_eps,
            zero_variance=c.zero_variance_groups,
        )

    def step(
        self,
        trajectories: Sequence[Trajectory],
        *,
        data_state: dict[str, Any] | None = None,
        advantages: Advantages | None = None,
        checkpoint: bool = True,
        keep_logprobs: int = 0,
    ) -> dict[str, float]:
        """Train on one batch; returns the step's metrics (identical on every rank).
        `advantages`: computed once by the caller (who also stored them); else computed here.
        `checkpoint=False`: the caller saves (`checkpoint_due`, `save_checkpoint`) once it has
        recorded the step, so a published checkpoint never runs ahead of the run store.
        `keep_logprobs`: keep up to this many segment tokens' pre-update logprobs in
        `self.kept_logprobs` for the run store (kept_logprobs.py; this rank's micro-batches)."""
        c = self.cfg
        t0 = time.perf_counter()
        adv = advantages if advantages is not None else self.advantages(trajectories)
        items = [(i, t, a) for i, (t, a) in enumerate(zip(trajectories, adv.values, strict=True)) if a is not None]
        metrics: dict[str, float] = dict(adv.metrics)
        chunks = [items[k :: c.minibatches] for k in range(c.minibatches)]
        reach = self.policy.receptive
        plans = [pack(chunk, c.sequence_unit, c.max_tokens_per_microbatch, receptive=reach) for chunk in chunks]
        plans = [p for p in plans if p]
        acc = _Accumulator(KeptLogprobs(keep_logprobs) if keep_logprobs > 0 else None)
        if plans:
            old_logprobs = self._precompute_old(plans, acc) if c.minibatches > 1 else None
            for m, mbs in enumerate(plans):
                self._optimizer_step(mbs, old_logprobs[m] if old_logprobs else None, acc, record=old_logprobs is None)
            self.version += 1
        self.step_count += 1
        if data_state is not None:
            self.data_state = dict(data_state)
        metrics.update(acc.finish(self, time.perf_counter() - t0, trained=bool(plans)))
        self.kept_logprobs = acc.kept
        if checkpoint and self.checkpoint_due():
            self.save_checkpoint()
        return metrics

    # ---- the policy version and the weights, changed outside a GSPO step ----------------

    def bump_version(self) -> int:
        """New weights arrived outside `step` (an SFT warm start, loaded weights, the control's
        SFT): turns sampled after the next sync say so. The trainer is the one owner of the
        version, so the loop never counts it by hand."""
        self.version += 1
        return self.version

    def snapshot(self) -> WeightsSnapshot:
        """The weights and the optimizer state as they are now (a copy; training goes on)."""
        return WeightsSnapshot(
            lm={k: v.detach().clone() for k, v in self.lm.state_dict().items()},
            optimizer=copy.deepcopy(self.optimizer.state_dict()),
        )

    def restore(self, snap: WeightsSnapshot) -> None:
        """Back to `snap`'s weights and optimizer state. The version is not bumped here: the
        caller trains on from them and bumps once, before the sync that serves the result."""
        self.lm.load_state_dict(snap.lm)
        self.optimizer.load_state_dict(snap.optimizer)

    def set_reference(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Freeze π_ref for `kl_coef`: the weights in `state` (a kept reference), else the
        weights now. Returns the reference's weights, for the caller to keep on disk."""
        ref = copy.deepcopy(self.policy)
        if state is not None:
            ref.lm.load_state_dict(state)
        ref.eval()
        ref.requires_grad_(False)
        self.reference = ref
        return {k: v.detach().cpu().clone() for k, v in ref.lm.state_dict().items()}

    def fresh_moments(self) -> None:
        """Forget AdamW's moments and step counts (the weights stay): the next update is the
        first of a new optimizer, bias correction included."""
        self.optimizer.state.clear()

    def sft(
        self,
        demos: Sequence[Trajectory],
        config: SFTConfig,
        log: Callable[[int, dict[str, float]], None] | None = None,
    ) -> dict[str, float]:
        """Imitation on `demos` with this trainer's own model, AdamW (its moments carry into
        GSPO) and log-prob options (the same packing and head as a GSPO step). The caller
        bumps the version once the weights are to be served."""
        self.policy.train()
        return sft(
            self.policy,
            demos,
            config,
            self.optimizer,
            log=log,
            opts=self.opts,
            max_tokens=self.cfg.max_tokens_per_microbatch,
        )

    def load_weights(self, path: str | Path) -> Path:
        """Only the model weights of a checkpoint or HF model directory (a warm start from
        elsewhere); ValueError naming what does not fit. Returns the directory read."""
        return ckpt.load_weights(self.lm, path)

    def checkpoint_due(self) -> bool:
        return bool(self.cfg.checkpoint_dir) and self.step_count % self.cfg.checkpoint_every == 0

    def _mine(self, mbs: list[MicroBatch]) -> list[MicroBatch | None]:
        """This rank's micro-batches, padded with None (a zero-loss forward) to the busiest rank."""
        if self.dist.world == 1:
            return list(mbs)
        parts = split_balanced(mbs, self.dist.world)
        most = max(len(p) for p in parts)
        return parts[self.dist.rank] + [None] * (most - len(parts[self.dist.rank]))

    @torch.no_grad()
    def _precompute_old(self, plans: list[list[MicroBatch]], acc: _Accumulator) -> list[dict[int, torch.Tensor]]:
        """π_old of every micro-batch before any update (keyed by id of the micro-batch)."""
        olds = []
        for mbs in plans:
            found: dict[int, torch.Tensor] = {}
            for mb in self._mine(mbs):
                out = self.policy(_dummy(self.device) if mb is None else mb.to(self.device), self.opts)
                if mb is not None:
                    found[id(mb)] = out.logprobs_N.detach().cpu()
                    acc.observe(mb, out, self.version)
            olds.append(found)
        return olds

    def _optimizer_step(
        self, mbs: list[MicroBatch], olds: dict[int, torch.Tensor] | None, acc: _Accumulator, *, record: bool
    ) -> None:
        c = self.cfg
        norm = Normalizer(
            tokens=float(sum(float(mb.mask_N.sum()) for mb in mbs)),
            units=float(sum(count_units(mb) for mb in mbs)),
            norm_tokens=float(c.norm_tokens),
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss_fn = LOSSES[c.loss]
        for mb_cpu in self._mine(mbs):
            mb = _dummy(self.device) if mb_cpu is None else mb_cpu.to(self.device)
            out = self.policy(mb, self.opts)
            if mb_cpu is None:
                self._backward(out.logprobs_N.sum() * 0.0, mb)
                continue
            if record:
                acc.observe(mb_cpu, out, self.version)
            if c.old_logprobs == "rollout":
                old_N = mb.rollout_logprobs_N
            elif olds is not None:
                old_N = olds[id(mb_cpu)].to(self.device)
            else:  # one optimizer step per batch: this forward *is* π_old
                old_N = out.logprobs_N.detach()
            weights_N, wstats = correction_weights(
                old_N,
                mb.rollout_logprobs_N,
                mb.mask_N,
                mb.unit_ids_N,
                mb.num_units,
                mode=c.correction,
                level=c.correction_level,
                tis_cap=c.tis_cap,
                mis_low=c.mis_low,
                mis_high=c.mis_high,
            )
            loss, lmetrics = loss_fn(
                out.logprobs_N,
                old_N,
                mb.advantages_N,
                mb.mask_N,
                mb.unit_ids_N,
                mb.num_units,
                clip_low=c.clip_low,
                clip_high=c.clip_high,
                weights_N=weights_N,
                aggregation=c.aggregation,
                norm=norm,
            )
            if c.kl_coef > 0 and self.reference is not None:
                with torch.no_grad():
                    ref_N = self.reference(mb, self.opts).logprobs_N
                kl_N = k3_kl_N(out.logprobs_N, ref_N)
                loss = loss + c.kl_coef * aggregate(kl_N, mb.mask_N, mb.unit_ids_N, mb.num_units, c.aggregation, norm)
                acc.kl_sum += float((kl_N.detach() * mb.mask_N).sum())
            self._backward(loss, mb)
            acc.add_loss(float(loss.detach()), lmetrics, wstats)
        grad_norm = self._clip()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)  # a model's worth of memory, not held until the next step
        acc.grad_norms.append(grad_norm)

    def _backward(self, loss: torch.Tensor, mb: MicroBatch) -> None:
        ctx = nullcontext()
        if self.policy.is_moe and self.checkpointing:  # recomputed layers must route the same
            replay = mb.replay_N_L_K if self.cfg.routing_replay else None
            ctx = moe_routing(self.lm, replay, router_fp32=self.cfg.router_fp32)
        with ctx:
            # FSDP averages gradients over ranks; the loss is already globally normalised
            (loss * self.dist.world if self.dist.enabled else loss).backward()

    def _clip(self) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    # ---- weights out, checkpoints -----------------------------------------------------

    def state_dict_for_engines(self) -> dict[str, torch.Tensor]:
        """Full weights of the HF model (a collective under FSDP)."""
        return full_state_dict(self.lm)

    async def sync_weights(self) -> None:
        """Push the current weights as `self.version` through the configured WeightSync."""
        if self.weight_sync is None:
            return
        state = await in_own_thread(self.state_dict_for_engines)
        if self.dist.is_main:
            await self.weight_sync.push(self.lm, state, self.version)

    async def train_step(
        self,
        trajectories: Sequence[Trajectory],
        *,
        data_state: dict[str, Any] | None = None,
        advantages: Advantages | None = None,
    ) -> dict[str, float]:
        """`step` off the event loop, then `sync_weights`."""
        metrics = await in_own_thread(self.step, trajectories, data_state=data_state, advantages=advantages)
        await self.sync_weights()
        return metrics

    def save_checkpoint(self, directory: str | Path | None = None) -> Path:
        directory = directory or self.cfg.checkpoint_dir
        if not directory:
            raise ValueError("no checkpoint directory: set trainer.checkpoint_dir or pass one")
        return ckpt.save_checkpoint(
            directory,
            lm=self.lm,
            policy=self.policy,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            step=self.step_count,
            version=self.version,
            data_state=self.data_state,
            config=self.cfg.model_dump(mode="json"),
            rank=self.dist.rank,
            keep=self.cfg.keep_checkpoints,
        )

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore from a `step_XXXXXXXX` directory, or the newest one inside `path`."""
        path = Path(path)
        if not (path / "trainer.pt").exists():
            found = ckpt.latest_checkpoint(path)
            if found is None:
                raise FileNotFoundError(f"no complete checkpoint in {path}")
            path = found
        state = ckpt.load_checkpoint(
            path,
            lm=self.lm,
            policy=self.policy,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            rank=self.dist.rank,
        )
        self.step_count, self.version, self.data_state = state["step"], state["version"], state["data_state"]


def _dummy(device: torch.device) -> MicroBatch:
    """A 2-token micro-batch whose loss is multiplied by 0: keeps FSDP collectives in step
    across ranks (one 'sampled' position so that the LM head is part of the graph)."""
    z = torch.zeros(2, dtype=torch.long, device=device)
    f = torch.zeros(2, dtype=torch.float32, device=device)
    mask = torch.tensor([1.0, 0.0], device=device)
    return MicroBatch(z, torch.arange(2, device=device), z, mask, f, f, z, z, z - 1, None, [2], 1)


class _Accumulator:
    """Sums the step's statistics over micro-batches, then over ranks."""

    def __init__(self, kept: KeptLogprobs | None = None) -> None:
        self.kept = kept
        self.loss = 0.0
        self.loss_parts: list[LossMetrics] = []
        self.mismatch = MismatchStats()
        self.sums = torch.zeros(9, dtype=torch.float64)  # see finish()
        self.grad_norms: list[float] = []
        self._min_ver = 2**62
        self.kl_sum = 0.0  # Σ k3 KL to π_ref over sampled tokens (kl_coef > 0; one process)

    def observe(self, mb: MicroBatch, out: Any, version: int) -> None:
        """Statistics of a pre-update forward of policy `version`: mismatch, entropy, routing,
        staleness. Mismatch is over the tokens that version sampled (or of unknown version):
        a stale token differs by the policy's own updates, which is not engine numerics
        (asynchronous runs otherwise report a 'mismatch' of every step's learning)."""
        mask = mb.mask_N > 0
        if self.kept is not None:
            self.kept.add(mb, out.logprobs_N)
        fresh_N = ((mb.versions_N < 0) | (mb.versions_N >= version)).to(mb.mask_N.dtype)
        self.mismatch.add(out.logprobs_N.cpu(), mb.rollout_logprobs_N, mb.mask_N * fresh_N)
        ent = out.entropy_N.detach().cpu()[mask]
        ver = mb.versions_N[mask]
        known = ver >= 0
        route = (0, 0, 0, 0)
        if out.used_N_L_K is not None and mb.replay_N_L_K is not None:
            rec = mb.replay_N_L_K
            valid = (rec >= 0).all(-1).all(-1)
            route = (
                *routing_mismatch(out.used_N_L_K.cpu(), rec, valid),
                *routing_mismatch(out.natural_N_L_K.cpu(), rec, valid),
            )
        self.sums += torch.tensor(
            [
                float(ent.sum()),
                float(mask.sum()),
                float(ver[known].sum()),
                float(known.sum()),
                float(route[0]),
                float(route[1]),
                float(route[2]),
                float(mb.num_tokens),
                0.0,
            ],
            dtype=torch.float64,
        )
        if bool(known.any()):
            self._min_ver = min(self._min_ver, int(ver[known].min()))

    def add_loss(self, loss: float, lm: LossMetrics, wstats: dict[str, float]) -> None:
        self.loss += loss
        self.loss_parts.append(lm)
        self.sums[8] += wstats.get("truncated", 0.0) + wstats.get("rejected", 0.0)

    def finish(self, trainer: Trainer, seconds: float, *, trained: bool) -> dict[str, float]:
        lm = LossMetrics.merge(self.loss_parts)
        red = torch.tensor([self.loss, lm.tokens, lm.clipped_tokens, lm.units, lm.seq_ratio_sum], dtype=torch.float64)
        all_reduce_(red, "sum")
        all_reduce_(self.sums, "sum")
        all_reduce_(self.mismatch.sums, "sum")
        mx = torch.tensor(
            [lm.seq_ratio_max, self.mismatch.max_abs_dp, self.mismatch.max_abs_dlogp], dtype=torch.float64
        )
        mn = torch.tensor([lm.seq_ratio_min, float(self._min_ver)], dtype=torch.float64)
        all_reduce_(mx, "max")
        all_reduce_(mn, "min")
        self.mismatch.max_abs_dp, self.mismatch.max_abs_dlogp = float(mx[1]), float(mx[2])
        merged = LossMetrics(float(red[1]), float(red[2]), float(red[3]), float(red[4]), float(mn[0]), float(mx[0]))
        ent, sampled, ver_sum, ver_n, r_used, r_tot, r_nat, tokens, corrected = self.sums.tolist()
        out: dict[str, float] = {"train/trained": float(trained), "policy/version": float(trainer.version)}
        if not trained:
            return out
        out.update(merged.as_dict())
        out.update(self.mismatch.metrics())
        # the last optimizer step's loss over the batch is the comparable number
        out["train/loss"] = float(red[0]) / max(len(self.grad_norms), 1)
        out["train/entropy"] = ent / sampled if sampled else 0.0
        out["train/grad_norm"] = self.grad_norms[-1]
        out["train/lr"] = trainer.scheduler.get_last_lr()[0]
        out["train/tokens"] = tokens
        out["train/sampled_tokens"] = sampled
        out["train/tokens_per_s"] = tokens / seconds if seconds > 0 else 0.0
        out["train/step_s"] = seconds
        out["train/optimizer_steps"] = float(len(self.grad_norms))
        out["mismatch/corrected_frac"] = corrected / sampled if sampled else 0.0
        if trainer.reference is not None:
            out["train/kl_ref"] = self.kl_sum / sampled if sampled else 0.0
        if r_tot:
            out["mismatch/routing_mismatch"] = r_used / r_tot
            out["mismatch/router_disagreement"] = r_nat / r_tot
        version_before = trainer.version - 1
        if ver_n:
            out["policy/staleness_mean"] = version_before - ver_sum / ver_n
            out["policy/staleness_max"] = version_before - float(mn[1])
        return out
