"""One default per knob: a config section that restates a component's fields must default to
what the component itself defaults to, so a run config and a direct API call behave alike
(the `[sandbox] agent_timeout_s` once said 600 s while `RolloutConfig` said 1800 s)."""

from __future__ import annotations

import dataclasses

from legorl.loop.config import RunConfig, SandboxSection, WarmStartSection
from legorl.rollout import RolloutConfig
from legorl.sandbox.base import Limits
from legorl.train.sft import SFTConfig
from legorl.verify.grade import GradeConfig


def test_the_sandbox_section_defaults_to_the_rollouts_own_defaults() -> None:
    assert SandboxSection().rollout_config() == RolloutConfig()


def test_every_sandbox_field_that_names_a_component_field_has_its_default() -> None:
    section = SandboxSection()
    components = [RolloutConfig(), Limits(), GradeConfig()]
    checked = 0
    for name in SandboxSection.model_fields:
        for comp in components:
            if name in {f.name for f in dataclasses.fields(comp)}:
                assert getattr(section, name) == getattr(comp, name), (name, type(comp).__name__)
                checked += 1
    assert checked >= 9  # agent_timeout_s, grade_empty_diff, 4 limits, 3 grading knobs


def test_the_warm_start_section_defaults_to_sfts_own_defaults() -> None:
    assert WarmStartSection().sft_config(seed=SFTConfig().seed) == SFTConfig()


def test_a_changed_section_value_reaches_the_component() -> None:
    cfg = RunConfig.model_validate({"sandbox": {"agent_timeout_s": 42, "memory_mb": 300, "test_timeout_s": 7}})
    rc = cfg.sandbox.rollout_config()
    assert (rc.agent_timeout_s, rc.limits.memory_mb, rc.grade.test_timeout_s) == (42, 300, 7)
