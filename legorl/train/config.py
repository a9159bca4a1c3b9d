"""The `[trainer]` config section: every knob of a training step, typed and documented.

Defaults follow the GSPO paper (clip 3e-4 / 4e-4, no KL, group-normalised outcome advantage)
and the precision choices that measurably shrink rollout/trainer mismatch (fp32 LM head and
log-softmax; see bench/mismatch.py). Values left as `None` take the loss's own default, set
in `resolved()`, so a TOML file only names what it changes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from legorl.config_base import Section

LossName = Literal["gspo", "gspo_token", "grpo", "dr_grpo"]
Aggregation = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "token_sum_norm"]
SequenceUnit = Literal["trajectory", "segment", "turn"]
Correction = Literal["none", "tis", "mis"]
CorrectionLevel = Literal["token", "sequence", "geometric"]

# (clip_low, clip_high, aggregation) per loss, from the papers: GSPO (arXiv 2507.18071, §5.1),
# DAPO's clip-higher for GRPO (arXiv 2503.14476), Dr.GRPO's token-sum (arXiv 2503.20783).
LOSS_DEFAULTS: dict[str, tuple[float, float, Aggregation]] = {
    "gspo": (3e-4, 4e-4, "seq_mean_token_mean"),
    "gspo_token": (3e-4, 4e-4, "seq_mean_token_mean"),
    "grpo": (0.2, 0.28, "seq_mean_token_mean"),
    "dr_grpo": (0.2, 0.28, "token_sum_norm"),
}


class TrainerConfig(Section):
    model: str = "tiny-qwen3"
    """Bundled model name or local HF model directory (see legorl.models.resolve_model)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of the trained model."""
    master_weights_fp32: bool = True
    """With dtype bfloat16: keep fp32 parameters and AdamW states and compute in bf16 (FSDP2
    mixed precision; a single process joins a one-rank group). False trains the bf16
    parameters directly, where updates of lr ~1e-6 mostly round away."""
    device: str = "cpu"
    """torch device; under torchrun on GPUs each rank uses cuda:<LOCAL_RANK>."""
    seed: int = 0
    """Seeds torch, numpy and random at start; their states are checkpointed."""

    loss: LossName = "gspo"
    """Policy loss: gspo (sequence ratio), gspo_token, grpo (token ratio), dr_grpo."""
    sequence_unit: SequenceUnit = "trajectory"
    """What one GSPO 'sequence' is in a multi-turn trajectory: the whole trajectory (one
    ratio per rollout, the outcome reward's natural unit), each segment, or each turn (a
    maximal run of sampled tokens). Also the 'sequence' of seq-mean aggregations."""
    clip_low: float | None = None
    """Lower clip range ε_low (ratio ≥ 1-ε_low). None: 3e-4 for GSPO, 0.2 for GRPO."""
    clip_high: float | None = None
    """Upper clip range ε_high (ratio ≤ 1+ε_high). None: 4e-4 for GSPO, 0.28 for GRPO."""
    aggregation: Aggregation | None = None
    """How per-token losses become one number. None: seq_mean_token_mean (GSPO, GRPO) or
    token_sum_norm (Dr.GRPO)."""
    norm_tokens: int = 4096
    """The constant divisor of token_sum_norm (Dr.GRPO's L): tokens per sequence budget."""

    scale_advantage_by_std: bool | None = None
    """Divide (reward - group mean) by the group std. None: True, except False for dr_grpo."""
    advantage_eps: float = 1e-6
    """Added to the group std before dividing."""
    zero_variance_groups: Literal["skip", "keep"] = "skip"
    """Groups whose valid rewards are all equal carry no signal: skip them (no tokens, no
    compute) or keep them (advantage 0, they still count in seq-mean denominators)."""

    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    """π_old for the clip ratio: the trainer's own recomputation before the update
    (decoupled; mismatch then handled by `correction`) or the engine's rollout logprobs
    (bypass; GSPO's tiny clip band then also absorbs numeric mismatch). With `max_staleness`
    the bypass makes the clip band a trust region around the policy that sampled each
    trajectory: one whose probability the last update already moved the way its advantage
    points gets no second push (the decoupled form's weights stay ≈ 1 after one update, so
    it pushes stale data as if it were fresh; docs/measured.md, "Asynchronous loop")."""
    correction: Correction = "none"
    """Rollout→trainer importance correction: truncated IS (weight min(ρ, tis_cap)) or
    masked IS (weight ρ inside [mis_low, mis_high], else the token/sequence is dropped)."""
    correction_level: CorrectionLevel = "token"
    """ρ per token, per sequence unit (product of token ratios) or per unit geometric mean
    (exp of the mean token log-ratio: the same length normalisation as GSPO's own sequence
    ratio, so one weight per trajectory on the scale of that ratio; what `max_staleness`
    runs were measured with, docs/measured.md, "Asynchronous loop")."""
    tis_cap: float = 2.0
    """C of TIS."""
    mis_low: float = 0.5
    """Lower bound of MIS."""
    mis_high: float = 2.0
    """Upper bound of MIS."""

    routing_replay: bool = True
    """MoE only: route every token through the experts the engine recorded (R3)."""
    lm_head_fp32: bool = True
    """Compute LM-head logits and log-softmax in fp32 even for a bf16 model."""
    router_fp32: bool = False
    """MoE only: compute router logits in fp32 (helps only if the engine does the same)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts; logprobs are recomputed at it."""
    logprob_chunk: int = 2048
    """Rows per chunk of the vocabulary projection; bounds fp32 logits memory."""
    max_tokens_per_microbatch: int = 8192
    """Token budget of one packed forward; a longer trajectory gets a micro-batch alone."""
    packing: Literal["packed", "per_segment", "shared_prefix"] = "shared_prefix"
    """`shared_prefix` (default): packed, with the tokens that segments share at their start
    (a harness's system prompt, a group's first prompt) computed once, exactly
    (legorl/train/shared_prefix.py; a family it is not exact for, or a run with gradient
    checkpointing on, falls back to packed, said in one line at start-up); `packed`: one
    forward over concatenated segments (position ids reset per segment, attention blocked
    across segments); `per_segment`: one forward per segment (slower; for kernels that cannot
    take packed sequences). Packing is refused, in one line, for a model type or attention
    kernel it has not been verified on (legorl/packed_families.py)."""
    attn_implementation: str = "legorl_varlen"
    """transformers attention kernel of the trained model: legorl_varlen (per-segment sdpa on
    packed rows, see varlen.py), flash_attention_2 (GPU, native varlen), sdpa (builds an
    N×N block mask for packed rows), eager."""
    experts_implementation: str | None = None
    """transformers MoE experts kernel (eager, batched_mm, grouped_mm); None: its default."""
    gradient_checkpointing: bool | Literal["auto"] = "auto"
    """Recompute decoder layers in backward to save activation memory (about one more forward
    of compute). `auto`: on when one full micro-batch's activations would exceed
    `activation_budget_gb` (legorl/train/activations.py: ~2 MB a token for SmolLM2-135M, so
    ~8 GB at 4096 tokens; ~30 kB for the quickstart's model, which stays off)."""
    activation_budget_gb: float = Field(1.0, gt=0)
    """`gradient_checkpointing = "auto"`: the most activation memory one micro-batch may keep
    for backward before checkpointing turns on."""

    lr: float = 1e-6
    """AdamW learning rate (peak)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 0
    """Linear warm-up optimizer steps."""
    schedule: Literal["constant", "cosine"] = "constant"
    """LR after warm-up: constant, or cosine decay to 0 at total_steps."""
    total_steps: int = 1000
    """Optimizer steps of the run (cosine schedule horizon)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 disables."""
    kl_coef: float = Field(0.0, ge=0.0)
    """β of a penalty β·KL(π‖π_ref) on every sampled token, added to the policy loss with the
    same aggregation. It uses the k3 estimator, as GRPO's does. π_ref is the policy as RL
    starts, i.e. the warm start. It anchors what the reward does not speak to: the
    tool-call format of a converged SFT drifted under RL (docs/measured.md). A run keeps
    π_ref in RUN_DIR/kl_reference.pt, so a resumed run pulls toward the same weights. 0 (the
    default) holds no reference model; above 0 there is a second, frozen copy of the weights
    and one more forward a step, in one trainer process."""
    minibatches: int = 1
    """Optimizer steps per batch of trajectories (GSPO paper: 4). With >1 the old logprobs
    are recomputed once before the first update."""

    checkpoint_dir: str = ""
    """Where checkpoints go; empty: no checkpoints."""
    checkpoint_every: int = 1
    """Save after every N calls of `Trainer.step` (one batch of trajectories each)."""
    keep_checkpoints: int = 2
    """Old checkpoints kept besides the newest."""

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 (greedy rollouts have no logprobs to train on)")
        for name in ("clip_low", "clip_high"):
            v = getattr(self, name)
            if v is not None and not (0.0 <= v < 10.0):
                raise ValueError(f"{name} must be in [0, 10), got {v}")
        if not (0 < self.mis_low < 1 <= self.mis_high):
            raise ValueError(f"need 0 < mis_low < 1 <= mis_high, got {self.mis_low}, {self.mis_high}")
        if self.tis_cap < 1:
            raise ValueError(f"tis_cap must be >= 1, got {self.tis_cap}")
        if self.minibatches < 1 or self.logprob_chunk < 1 or self.max_tokens_per_microbatch < 2:
            raise ValueError("minibatches, logprob_chunk must be >= 1, max_tokens_per_microbatch >= 2")
        if self.norm_tokens < 1:
            raise ValueError("norm_tokens must be >= 1")
        if self.correction != "none" and self.old_logprobs == "rollout":
            raise ValueError("correction reweights by π_old/π_rollout: it needs old_logprobs = 'recompute'")
        return self

    def resolved(self) -> TrainerConfig:
        """A copy with every loss-dependent `None` replaced by that loss's default."""
        low, high, agg = LOSS_DEFAULTS[self.loss]
        return self.model_copy(
            update={
                "clip_low": low if self.clip_low is None else self.clip_low,
                "clip_high": high if self.clip_high is None else self.clip_high,
                "aggregation": agg if self.aggregation is None else self.aggregation,
                "scale_advantage_by_std": (self.loss != "dr_grpo")
                if self.scale_advantage_by_std is None
                else self.scale_advantage_by_std,
            }
        )
