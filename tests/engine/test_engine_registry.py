"""`EngineConfig` validation and `make_engine` for every registered kind."""

from __future__ import annotations

import pydantic
import pytest

from legorl.engine import registry
from legorl.engine.base import Engine
from legorl.engine.registry import EngineConfig, make_engine, register_engine
from legorl.types import SamplingParams


def test_every_field_is_documented() -> None:
    for name, field in EngineConfig.model_fields.items():
        assert field.description, f"EngineConfig.{name} has no docstring"


def test_bad_values_fail_with_the_field_name() -> None:
    with pytest.raises(pydantic.ValidationError, match="kind"):
        EngineConfig(kind="tgi")
    with pytest.raises(pydantic.ValidationError, match="max_batch_size"):
        EngineConfig(max_batch_size=0)
    with pytest.raises(pydantic.ValidationError, match="temprature"):
        EngineConfig(temprature=1.0)
    with pytest.raises(pydantic.ValidationError, match="engine.url is required"):
        EngineConfig(kind="vllm")
    with pytest.raises(pydantic.ValidationError, match="scripted_completions"):
        EngineConfig(kind="scripted")


async def test_make_engine_builds_each_builtin_kind() -> None:
    built = [
        make_engine(EngineConfig(kind="scripted", scripted_completions=["hi"])),
        make_engine(EngineConfig(kind="vllm", url="http://127.0.0.1:8000")),
        make_engine(EngineConfig(kind="sglang", url="http://127.0.0.1:30000")),
        make_engine(EngineConfig(kind="hf", model="tiny-qwen3", max_batch_size=4)),
    ]
    try:
        assert [e.name for e in built] == ["scripted", "vllm", "sglang", "hf"]
        assert all(isinstance(e, Engine) for e in built)
        g = await built[0].generate([1, 2, 3], SamplingParams())
        assert g.completion_ids[-1] == 2  # "hi" + <|im_end|>
        assert built[3].max_batch_size == 4
    finally:
        for e in built:
            await e.close()


def test_missing_oracle_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.ENGINES, "oracle", "legorl.engine.no_such_oracle:OracleEngine")
    with pytest.raises(ValueError, match="legorl.engine.no_such_oracle is not installed"):
        make_engine(EngineConfig(kind="oracle"))


def test_registered_factories_are_called_with_config_and_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "ENGINES", dict(registry.ENGINES))
    register_engine("oracle", f"{__name__}:make_fake")
    cfg = EngineConfig(kind="oracle", options={"answer": 42})
    assert make_engine(cfg, tokenizer="tok") == ("fake", 42, "tok")
    with pytest.raises(ValueError, match="package.module:Name"):
        register_engine("x", "no_colon")


def make_fake(cfg: EngineConfig, tokenizer: object) -> tuple[str, int, object]:
    return ("fake", cfg.options["answer"], tokenizer)


def test_a_kind_registered_after_import_passes_the_config_and_an_unknown_one_is_named() -> None:
    """The registry is the one list of engine kinds: the config reads it when it loads."""
    from legorl.engine.registry import ENGINES, EngineConfig, register_engine

    register_engine("zz-probe-engine", "legorl.engine.scripted:ScriptedEngine")
    try:
        assert EngineConfig(kind="zz-probe-engine").kind == "zz-probe-engine"
    finally:
        ENGINES.pop("zz-probe-engine")
    with pytest.raises(ValueError, match="'nonesuch' is not a registered engine"):
        EngineConfig(kind="nonesuch")
