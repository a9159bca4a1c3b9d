"""SmolLM2-135M-Instruct in tests: its name, the example config, and that config shrunk to a
slice a test can afford (shared by the `hf` and the real-vLLM SmolLM2 tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from legorl.gguf_models import GgufUnavailable, gguf_file
from tests.helpers.paths import ROOT

NAME = "smollm2-135m-instruct"
EXAMPLE = ROOT / "examples" / "smollm2-calc.toml"
try:
    gguf_file(NAME)
    MISSING: str | None = None
except GgufUnavailable as e:  # only where the PyPI package cannot be installed
    MISSING = str(e)


def shrunk(run_dir: Path, *, steps: int = 1, tasks_per_step: int = 1, engine: dict[str, Any] | None = None) -> Any:
    """The example config cut to `steps` GSPO steps of `tasks_per_step` × 2 rollouts (no warm
    start, no held-out evaluation, short turns); `engine` replaces its `[engine]`. Everything
    else (template, harness, sandbox, trainer) as shipped."""
    from legorl.loop.config import RunConfig, load_run_config

    d = load_run_config(EXAMPLE).model_dump()
    n = steps * tasks_per_step
    d["run"].update(
        dir=run_dir,
        steps=steps,
        tasks_per_step=tasks_per_step,
        group_size=2,
        max_concurrent_rollouts=2 * tasks_per_step,
    )
    d["run"]["time_budget_s"] = None
    d["calc_tasks"].update(train=max(2, n), heldout=1)
    d["heldout"]["tasks"] = 0
    d["warm_start"].update(episodes=0, control_steps=0)
    d["proxy"]["max_tokens"] = 24
    d["harness"]["max_turns"] = 2
    d["trainer"]["zero_variance_groups"] = "keep"  # failed rollouts still make a step
    if engine is not None:
        d["engine"] = engine
    return RunConfig.model_validate(d)
