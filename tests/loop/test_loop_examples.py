"""Every config under examples/ loads and validates, and its harness options are ones the
adapter knows (a typo in `[harness.options]` would otherwise fail only on the GPU cluster)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from legorl.loop.config import load_run_config
from tests.helpers.paths import ROOT

EXAMPLES = ROOT / "examples"
# run configs (the quickstart has its own [quickstart] schema, tested in test_quickstart*)
CONFIGS = sorted(p for p in EXAMPLES.glob("*.toml") if "[quickstart]" not in p.read_text())
GPU = [p for p in CONFIGS if p.name.startswith("swebench-")]


def test_there_is_a_gpu_example_per_native_harness() -> None:
    from legorl.harness.registry import NATIVE

    names = {load_run_config(p).harness.name for p in GPU}
    assert names == set(NATIVE), names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_loads(path: Path) -> None:
    cfg = load_run_config(path)
    assert cfg.run.dir.is_absolute() and cfg.run.dir.is_relative_to(EXAMPLES)
    if cfg.harness.name == "command":
        assert cfg.harness.command_file is not None and cfg.harness.command_file.exists()
    else:
        from legorl.harness.registry import harness_class, make_harness

        adapter = make_harness(
            cfg.harness.name, model=cfg.harness.model_name, max_turns=cfg.harness.max_turns, **cfg.harness.options
        )  # unknown options raise here
        assert dataclasses.is_dataclass(adapter) and isinstance(adapter, harness_class(cfg.harness.name))
    if path in GPU:
        assert cfg.engine.kind in ("vllm", "sglang") and cfg.engine.url
        assert cfg.ray.enabled and cfg.sandbox.backend == "docker"
        assert cfg.trainer.model == cfg.engine.model  # the trainer trains the model the engine serves
        assert cfg.proxy.max_context <= (cfg.engine.max_context or 32768)
        if cfg.engine.return_routed_experts and cfg.engine.kind == "sglang":
            assert cfg.engine.moe_top_k, "SGLang returns routing flat: moe_top_k shapes it"
