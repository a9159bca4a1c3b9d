"""The run config (`legorl train|eval CONFIG.toml`): one section per component.

Sections are owned by their components (`[engine]` by engine/registry.py, `[proxy]` by
proxy/config.py, `[trainer]` by train/config.py, `[monitor]` by monitor/monitors.py);
the ones defined here belong to the loop itself. Relative paths are resolved against the
config file's directory, so a config can be run from anywhere.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from legorl.config import ConfigError, load
from legorl.config_base import Section
from legorl.engine.registry import EngineConfig
from legorl.harness.base import MAX_TURNS
from legorl.harness.registry import COMMAND, adapter_options, harness_names
from legorl.monitor.monitors import MonitorConfig
from legorl.options import check_options
from legorl.proxy.config import ProxyConfig
from legorl.quickstart.source import CalcTasksSection
from legorl.rollout import RolloutConfig
from legorl.sandbox.base import Limits
from legorl.train.config import TrainerConfig
from legorl.train.sft import SFTConfig
from legorl.trajectory import SIDE_CALLS_DEFAULT, SideCalls
from legorl.verify.grade import GradeConfig

# Each knob's default is said once, by the component that uses it; a section reads it from
# there (tests/loop/test_config_defaults.py checks that they agree).
_ROLLOUT, _LIMITS, _GRADE, _SFT = RolloutConfig(), Limits(), GradeConfig(), SFTConfig()


class RunSection(Section):
    """`[run]`: what to train on, how much, and where the run directory is."""

    dir: Path = Path("runs/default")
    """Run directory: run.sqlite (the store), checkpoints, logs."""
    tasks: str = "shipped"
    """Task JSONL (SWE-bench format + repo_path); `shipped` for the bundled generated tasks;
    `quickstart-calc` for the quickstart's generated family (sized by `[calc_tasks]`)."""
    split: str | None = "train"
    """Task split used for training (`None`: every task in the file)."""
    eval_split: str | None = "heldout"
    """Task split `legorl eval` uses by default."""
    steps: int = Field(2, ge=1)
    """Training steps."""
    tasks_per_step: int = Field(2, ge=1)
    """Tasks sampled per step (each gets one group)."""
    group_size: int = Field(4, ge=1)
    """Rollouts per task per step (G); advantages are normalised within a group."""
    max_concurrent_rollouts: int = Field(4, ge=1)
    """Rollouts (sandboxes + proxy sessions) in flight at once on this machine."""
    seed: int = 0
    """Seed of task sampling."""
    max_staleness: int = Field(0, ge=0)
    """Asynchronous off-policy training: the rollouts of up to this many later steps run
    while the trainer trains (0: synchronous, each step waits for its own rollouts). A
    trajectory whose oldest token is more than this many policy versions behind the
    trainer is handled per `stale`; the loss sees the rest's behaviour logprobs: as GSPO's
    π_old (`trainer.old_logprobs = "rollout"`, what the learning test runs) or as importance
    weights (`trainer.correction`)."""
    stale: Literal["drop", "correct"] = "drop"
    """A trajectory past `max_staleness`: left out of the step (counted), or trained on with
    the trainer's importance correction like the fresher ones."""
    ui: bool = False
    """Serve the live UI while training (`ui_port`)."""
    ui_port: int = Field(8780, ge=0, le=65535)
    """Port of the live UI."""
    time_budget_s: float | None = Field(None, gt=0)
    """Wall-clock budget of the whole run; the held-out report says whether it stayed inside."""


class SandboxSection(Section):
    """`[sandbox]`: where rollouts run."""

    backend: Literal["local", "docker"] = "local"
    """`local` (namespaces + overlayfs, the embedded default) or `docker`."""
    agent_timeout_s: float = Field(_ROLLOUT.agent_timeout_s, gt=0)
    """Wall-clock budget of one harness run; past it the rollout is `agent_timeout`."""
    retries: int = Field(2, ge=0)
    """Fresh-sandbox retries of an infrastructure fault before `infra_error`."""
    memory_mb: int = Field(_LIMITS.memory_mb, ge=64)
    """Memory limit of an agent sandbox."""
    pids: int = Field(_LIMITS.pids, ge=16)
    """Process limit of an agent sandbox."""
    cpus: float = Field(_LIMITS.cpus, gt=0)
    """CPU limit of an agent sandbox."""
    disk_mb: int = Field(_LIMITS.disk_mb, ge=16)
    """Disk quota of an agent sandbox."""
    test_timeout_s: float = Field(_GRADE.test_timeout_s, gt=0)
    """Grading: a test run longer than this is the patch's fault (`test_timeout`)."""
    max_diff_bytes: int = Field(_GRADE.max_diff_bytes, ge=1)
    """Grading: a larger diff is graded 0 (`patch_too_large`) without being applied."""
    penalize_tamper: bool = _GRADE.penalize_tamper
    """Grading: a visible attempt to tamper with the tests is `hack_detected`, reward 0."""
    grade_empty_diff: bool = _ROLLOUT.grade_empty_diff
    """Run the tests on an empty diff too (default: `no_patch` without running them)."""

    def changed(self) -> dict[str, Any]:
        """The knobs set away from their defaults (what a task kind may have to refuse)."""
        return {k: v for k, v in self if v != type(self).model_fields[k].default}

    def rollout_config(self) -> RolloutConfig:
        """The one place the section becomes the rollout's (and its grading's) parameters."""
        limits = Limits(memory_mb=self.memory_mb, pids=self.pids, cpus=self.cpus, disk_mb=self.disk_mb)
        grade = GradeConfig(
            test_timeout_s=self.test_timeout_s, max_diff_bytes=self.max_diff_bytes, penalize_tamper=self.penalize_tamper
        )
        return RolloutConfig(
            agent_timeout_s=self.agent_timeout_s, limits=limits, grade_empty_diff=self.grade_empty_diff, grade=grade
        )


if TYPE_CHECKING:  # a checker cannot read a Literal built at run time
    HarnessName = str
else:  # the names are said once, in legorl/harness/registry.py
    HarnessName = Literal[harness_names()]


class HarnessSection(Section):
    """`[harness]`: which agent program runs in the sandbox."""

    name: HarnessName = COMMAND
    """The harness; its adapter only writes config and a command line. `mini-swe-agent-warm`:
    mini-swe-agent in one long-lived process beside the sandboxes, every command in the
    rollout's sandbox (legorl/harness/warm_mini.py); `openhands-warm` likewise for the
    OpenHands SDK (legorl/harness/openhands_warm.py)."""
    command_file: Path | None = None
    """`command`: the shell script that is the agent."""
    max_turns: int = Field(MAX_TURNS, ge=1)
    """Turn/step limit passed to the harness (its own `max_turns`)."""
    model_name: str | None = None
    """Model name the harness is told to use (default: the proxy's served model name)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Adapter-specific settings: the fields of the adapter's dataclass (legorl/harness/<name>.py),
    checked against it when the config loads."""
    mix: dict[str, float] = Field(default_factory=dict)
    """Mixed-harness training (`{ claude-code = 1, opencode = 1, openhands = 1 }`): each task's
    group runs in one harness drawn by these weights (every member the same harness, the draw
    recorded on the trajectory), one policy for all; held-out evaluations run once per harness.
    Empty: every rollout runs in `name`."""
    side_calls: SideCalls = SIDE_CALLS_DEFAULT
    """What a trajectory does with the side calls the harness makes with the policy (titles,
    compaction summaries: `proxy.side_call_patterns`): "separate" records them apart, never
    trained; "train" trains them as segments of their own under the rollout's one advantage
    (legorl/trajectory.py). Either way the token ledger counts them."""

    @model_validator(mode="after")
    def _command(self) -> HarnessSection:
        if self.mix:
            known = harness_names()
            if unknown := sorted(set(self.mix) - set(known)):
                raise ValueError(f"harness.mix names unknown harnesses {unknown} (known: {', '.join(known)})")
            if any(not (w >= 0 and w < float("inf")) for w in self.mix.values()) or sum(self.mix.values()) <= 0:
                raise ValueError(f"harness.mix weights must be finite, >= 0 and sum to more than 0, got {self.mix}")
            if COMMAND in self.mix or self.options:
                raise ValueError("harness.mix takes neither the `command` harness nor harness.options (one adapter's)")
            self.mix = {k: float(w) for k, w in self.mix.items() if w > 0}
            return self
        if self.name == COMMAND and self.command_file is None:
            raise ValueError("harness.command_file is required when harness.name = 'command'")
        if self.options:  # only then is the adapter's module imported
            self.options = check_options(self.options, adapter_options(self.name), self.name)
        return self

    def names(self) -> list[str]:
        """Every harness this run's rollouts may run in: the mix's, or `name`."""
        return list(self.mix) or [self.name]

    def draw(self, seed: int, step: int, instance_id: str) -> str:
        """The harness of one task's group at one step: a pure function of the seed, the step
        and the task (a resumed run draws what the uninterrupted one did)."""
        if not self.mix:
            return self.name
        rng = random.Random(f"{seed}:{step}:{instance_id}")
        return rng.choices(list(self.mix), weights=list(self.mix.values()))[0]

    def harness_options(self, served_model: str) -> dict[str, Any]:
        """What `make_harness(self.name, **...)` is given: the model the harness is told to use
        (default: the proxy's `served_model`), its turn limit, the command file (`command`)
        and the adapter's own options."""
        return {
            "model": self.model_name or served_model,
            "max_turns": self.max_turns,
            "command_file": self.command_file,
            **self.options,
        }


class RayConfig(Section):
    """`[ray]`: run rollout workers as Ray actors (one machine or a cluster)."""

    enabled: bool = False
    """Use Ray for rollouts; the trainer and (for `hf`) the engine stay in the driver."""
    address: str | None = None
    """Ray cluster address (`auto`, `ray://host:port`); None starts a local cluster."""
    workers: int = Field(2, ge=1)
    """Rollout worker actors."""
    num_cpus_per_worker: float = Field(0.5, gt=0)
    """CPUs Ray reserves per worker actor."""
    worker_resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each worker actor needs (e.g. `{ worker_node = 1 }` with nodes
    started by `ray start --resources '{"worker_node": 2}'`): where rollouts may run."""
    lost_rollout_retries: int = Field(1, ge=0)
    """A rollout whose worker died (process killed, node lost) runs again from the start on
    a live worker this many times before it is masked as an infra error. The lost attempt
    left nothing in the run store (records reach the driver only when graded)."""


class EvalSection(Section):
    """`[eval]`: `legorl eval` settings."""

    k: int = Field(1, ge=1)
    """Samples per task: pass@1 (mean over samples) and pass@k are reported."""
    limit: int | None = Field(None, ge=1)
    """Evaluate only the first N tasks of the split."""
    endpoint: str | None = None
    """External OpenAI- or Anthropic-compatible base URL to evaluate instead of our engine."""
    endpoint_api_key: str | None = None
    """API key for `endpoint`."""


class WarmStartSection(Section):
    """`[warm_start]`: SFT on demonstrations before GSPO (off while `episodes = 0`)."""

    episodes: int = Field(0, ge=0)
    """Demonstrations to record: one rollout of the demonstrator per training task (0: none)."""
    checkpoint: Path | None = None
    """Instead of demonstrations: start from these weights (a `step_XXXXXXXX` checkpoint, a
    checkpoint directory (its newest) or an HF model directory; relative to the config file)."""
    engine: EngineConfig = Field(default_factory=lambda: EngineConfig(kind="quickstart-expert"))
    """The demonstrator (`[warm_start.engine]`, same fields as `[engine]`)."""
    keep: Literal["all", "resolved"] = "all"
    """Which demonstrations are imitated (infrastructure errors never are)."""
    distinct_tasks: int | None = Field(None, ge=1)
    """Demonstrate only this many training tasks, each `episodes / distinct_tasks` times (None:
    every demonstration a different task). A demonstrator that is right only part of the time
    (the quickstart's) then shows its spread on one observation. With one demonstration per
    task, SFT can memorise each task's single pick and generalise it as a confident, arbitrary
    choice that RL must first unlearn (docs/measured.md)."""
    steps: int = Field(_SFT.steps, ge=0)
    """SFT optimizer steps."""
    batch_size: int = Field(_SFT.batch_size, ge=1)
    """Demonstrations per SFT step."""
    lr: float = Field(_SFT.lr, gt=0)
    """Peak SFT learning rate (linear warm-up, cosine decay to `min_lr_ratio` of it)."""
    warmup_steps: int = Field(_SFT.warmup_steps, ge=0)
    """SFT warm-up steps."""
    min_lr_ratio: float = Field(_SFT.min_lr_ratio, gt=0, le=1)
    """Final SFT learning rate as a fraction of `lr`."""
    control_steps: int = Field(0, ge=0)
    """The control (needs `[heldout]`): from the same warm-start checkpoint, this many more SFT
    steps (at the final SFT learning rate) instead of GSPO, evaluated on the same held-out
    tasks — does more imitation do what GSPO did?"""
    gspo_moments: Literal["carry", "fresh"] = "carry"
    """AdamW's moments when GSPO begins after the demonstrations' SFT: carried from the SFT, or
    fresh (as after a `checkpoint` warm start, and as in a separate RL job). An SFT that has
    converged leaves second moments scaled to imitation gradients, here 20-50x smaller than
    GSPO's first ones, so a carried state turns them into steps far above `lr`. The control
    always continues the SFT's own moments."""

    @model_validator(mode="after")
    def _one_source(self) -> WarmStartSection:
        if self.episodes and self.checkpoint is not None:
            raise ValueError("warm_start: set either episodes (demonstrations + SFT) or checkpoint, not both")
        if self.control_steps and not self.episodes:
            raise ValueError("warm_start.control_steps needs demonstrations (warm_start.episodes > 0)")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.episodes) or self.checkpoint is not None

    def sft_config(self, seed: int) -> SFTConfig:
        return SFTConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            min_lr_ratio=self.min_lr_ratio,
            seed=seed,
        )

    def control_config(self, seed: int) -> SFTConfig:
        tail = self.lr * self.min_lr_ratio
        return SFTConfig(
            steps=self.control_steps,
            batch_size=self.batch_size,
            lr=tail,
            warmup_steps=0,
            min_lr_ratio=1.0,
            seed=seed + 1,
        )


Point = Literal["start", "warm_start", "end"]


class HeldoutSection(Section):
    """`[heldout]`: held-out evaluations during `legorl train` (off while `tasks = 0`)."""

    tasks: int = Field(0, ge=0)
    """Held-out tasks per evaluation, one rollout each (the first N of the split)."""
    split: str = "heldout"
    """The task split evaluated."""
    at: list[Point] = Field(default_factory=lambda: ["start", "warm_start", "end"])
    """When: before anything is trained, after the warm start, after the last GSPO step."""


class RunConfig(Section):
    """A whole run: every component's section."""

    run: RunSection = Field(default_factory=RunSection)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    sandbox: SandboxSection = Field(default_factory=SandboxSection)
    harness: HarnessSection = Field(default_factory=lambda: HarnessSection(name="mini-swe-agent"))
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    eval: EvalSection = Field(default_factory=EvalSection)
    calc_tasks: CalcTasksSection = Field(default_factory=CalcTasksSection)
    warm_start: WarmStartSection = Field(default_factory=WarmStartSection)
    heldout: HeldoutSection = Field(default_factory=HeldoutSection)

    @model_validator(mode="after")
    def _sampling_matches_recompute(self) -> RunConfig:
        """The trainer recomputes logprobs as a full softmax at the sampling temperature, so
        the proxy must sample from exactly that distribution (else every ratio is biased)."""
        p, t = self.proxy, self.trainer
        if p.temperature != t.temperature:
            raise ValueError(
                f"trainer.temperature ({t.temperature}) must equal proxy.temperature "
                f"({p.temperature}): logprobs are recomputed at the sampling temperature"
            )
        if self.run.max_staleness and t.correction == "none" and t.old_logprobs != "rollout":
            raise ValueError(
                "run.max_staleness > 0 trains on tokens of older policies: set trainer.old_logprobs = "
                "'rollout' (the clip ratio against the recorded behaviour logprobs: a trust region around "
                "the policy that sampled them; what the learning test runs) or trainer.correction to 'tis' "
                "or 'mis' (importance weights against them, with the clip around the current policy)"
            )
        if self.warm_start.control_steps and not self.heldout.tasks:
            raise ValueError("warm_start.control_steps needs a held-out evaluation (heldout.tasks > 0) to compare with")
        if p.top_p != 1.0 or p.top_k != -1:
            raise ValueError(
                "proxy.top_p must be 1 and proxy.top_k -1 when training: the trainer's "
                "recomputation has no nucleus/top-k truncation"
            )
        if Path(self.run.tasks).is_absolute() and (why := unhonoured_knob(self)):
            raise ValueError(why)  # a relative source is checked once resolved (load_run_config)
        return self


def unhonoured_knob(cfg: RunConfig) -> str | None:
    """One line refusing a `[sandbox]` knob the run's tasks cannot honour (their kind says
    which, `tasks/kinds/`): a Harbor task takes its timeouts and limits from its task.toml."""
    from legorl.tasks.kinds import unhonoured

    return unhonoured(cfg.run.tasks, cfg.sandbox.changed())


def _resolve(base: Path, p: Path | None) -> Path | None:
    return None if p is None or p.is_absolute() else (base / p).resolve()


def load_run_config(path: Path) -> RunConfig:
    """Load and validate; relative paths become relative to the config file."""
    cfg = load(RunConfig, path)
    base = path.resolve().parent
    cfg.run.dir = _resolve(base, cfg.run.dir) or cfg.run.dir
    if cfg.run.tasks not in ("shipped", "quickstart-calc") and not Path(cfg.run.tasks).is_absolute():
        cfg.run.tasks = str((base / cfg.run.tasks).resolve())
    cfg.harness.command_file = _resolve(base, cfg.harness.command_file) or cfg.harness.command_file
    cfg.warm_start.checkpoint = _resolve(base, cfg.warm_start.checkpoint) or cfg.warm_start.checkpoint
    if why := unhonoured_knob(cfg):
        raise ConfigError(f"{path}: invalid configuration\n  {why}")
    return cfg
