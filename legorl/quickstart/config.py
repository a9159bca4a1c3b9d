"""The `[quickstart]` config section (examples/quickstart.toml): every knob, typed and documented."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from legorl.config_base import Section


class QuickstartConfig(Section):
    run_dir: Path = Path("runs/quickstart")
    """Run directory (run.sqlite, quickstart_results.json); relative to the config file."""
    seed: int = 0
    """Seeds the model's sampling, the expert's draws and the order of training tasks."""
    model: str = "quickstart-qwen3"
    """Bundled model (random weights from a fixed seed) or a local HF model directory."""

    functions_per_task: int = Field(3, ge=2, le=8)
    """Functions in each task's calc.py; one of them is broken."""
    p_read: float = Field(0.3, ge=0.0, le=1.0)
    """How often the expert reads the FAIL line; otherwise it fixes the first function the
    test output mentions. The demonstrations' success rate is p_read + (1 - p_read) / k."""

    expert_episodes: int = Field(500, ge=1)
    """SFT demonstrations, each one real mini-swe-agent episode against the expert engine."""
    heldout_episodes: int = Field(300, ge=1)
    """Held-out episodes per evaluation (three evaluations: start, after SFT, after GSPO)."""
    harness_eval_episodes: int = Field(64, ge=0)
    """Of those, how many are also run through the real harness at each checkpoint
    (the rest of the table uses the in-process path with the same messages)."""
    harness: Literal["mini-swe-agent", "none"] = "mini-swe-agent"
    """`none`: the in-process path everywhere (no harness installed; tests, CI smoke)."""
    harness_threads: int = Field(32, ge=1)
    """Concurrent mini-swe-agent episodes in the worker process."""

    max_tokens: int = Field(48, ge=8)
    """Completion cap per model call (an episode needs ~12 and ~33 tokens)."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature of every rollout and evaluation (the trained distribution)."""

    sft_steps: int = Field(200, ge=0)
    """SFT optimizer steps."""
    sft_batch_size: int = Field(32, ge=1)
    """Trajectories per SFT step."""
    sft_lr: float = Field(3e-3, gt=0.0)
    """SFT peak learning rate (warm-up 20 steps, cosine to 10%)."""

    rl_steps: int = Field(20, ge=0)
    """GSPO steps."""
    rl_tasks_per_step: int = Field(16, ge=1)
    """Training tasks per GSPO step (each one group)."""
    rl_group_size: int = Field(8, ge=2)
    """Rollouts per task; advantages are normalised within the group."""
    rl_lr: float = Field(3e-4, gt=0.0)
    """GSPO learning rate (AdamW, moments carried over from SFT)."""

    control_sft_steps: int = Field(0, ge=0)
    """If > 0, a control: from the same SFT checkpoint, SFT continues for this many more
    steps (at the final SFT learning rate) instead of GSPO, and is evaluated on the same
    held-out tasks. 64 steps × 32 trajectories ≈ the trajectories GSPO trains on in 20
    steps. Shows whether more imitation would have done what GSPO did."""

    time_budget_s: float = Field(900.0, gt=0.0)
    """Wall-clock budget of the whole run; the run reports whether it stayed inside."""


def load_quickstart(path: Path) -> QuickstartConfig:
    """Read the `[quickstart]` table of a TOML file (other tables are ignored)."""
    from legorl.config import ConfigError, read_toml, validate

    data = read_toml(path)
    if "quickstart" not in data:
        raise ConfigError(f"{path}: no [quickstart] table")
    cfg = validate(QuickstartConfig, data["quickstart"], f"{path} [quickstart]")
    if not cfg.run_dir.is_absolute():
        cfg.run_dir = (Path(path).resolve().parent / cfg.run_dir).resolve()
    return cfg

