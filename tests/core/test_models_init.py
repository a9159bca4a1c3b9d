"""A bundled model's `init.json`: its departures from the family's random init are applied
when it is materialised, and a changed init is a changed model (the cache is rebuilt)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from legorl import models


def _norm_gains(model_dir: Path) -> set[float]:
    from safetensors.torch import load_file

    weights = load_file(model_dir / "model.safetensors")
    return {round(float(v.mean()), 4) for k, v in weights.items() if k.endswith(("q_norm.weight", "k_norm.weight"))}


def test_harness_model_starts_with_its_qk_norm_gain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEGORL_CACHE", str(tmp_path))
    out = models.resolve_model("harness-qwen3")
    assert _norm_gains(out) == {1.25}
    assert (out / models.INIT_FILE).exists()


def test_a_changed_init_rebuilds_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src" / "m"
    src.mkdir(parents=True)
    (src / "config.json").write_text((models.BUNDLED["tiny-qwen3"] / "config.json").read_text())
    monkeypatch.setitem(models.BUNDLED, "m", src)
    monkeypatch.setenv("LEGORL_CACHE", str(tmp_path / "cache"))
    assert _norm_gains(models.resolve_model("m")) == {1.0}  # the family's own init
    (src / models.INIT_FILE).write_text(json.dumps({"qk_norm_gain": 2.0}))
    assert _norm_gains(models.resolve_model("m")) == {2.0}
    (src / models.INIT_FILE).unlink()
    assert _norm_gains(models.resolve_model("m")) == {1.0}


def test_an_unknown_init_key_is_refused() -> None:
    lm = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="unknown keys \\['qk_gain'\\]"):
        models.apply_init(lm, {"qk_gain": 2.0})
