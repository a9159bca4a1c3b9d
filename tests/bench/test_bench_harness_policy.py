"""bench/harness_policy.py's run: the base config with only the policy, the token budget, the
step count and the control changed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bench.harness_policy import config
from tests.helpers.paths import ROOT


@pytest.mark.parametrize("base", ["quickstart.toml", "quickstart-claude-code.toml"])
def test_a_variant_run_changes_only_what_it_says(base: str, tmp_path: Path) -> None:
    path = ROOT / "examples" / base
    before, after = tomllib.loads(path.read_text()), tomllib.loads(config(tmp_path / "m", tmp_path / "run", path))
    assert after["run"]["dir"] == str(tmp_path / "run") and after["run"]["steps"] == 16
    assert (
        after["engine"]["model"]
        == after["trainer"]["model"]
        == after["warm_start"]["engine"]["model"]
        == str(tmp_path / "m")
    )
    assert after["proxy"]["max_tokens"] == 96 and after["warm_start"]["control_steps"] == 0
    assert after["warm_start"]["steps"] == before["warm_start"]["steps"]  # SFT is not GSPO's step count
    assert after["harness"] == before["harness"] and after["calc_tasks"] == before["calc_tasks"]


def test_without_start_the_random_init_is_not_evaluated(tmp_path: Path) -> None:
    path = ROOT / "examples" / "quickstart-claude-code.toml"
    after = tomllib.loads(config(tmp_path / "m", tmp_path / "run", path, start=False))
    assert after["heldout"]["at"] == ["warm_start", "end"]


def test_the_bundled_bpe_variant_is_the_old_policy_and_the_committed_one_the_quickstarts_bpe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from bench.harness_policy import VARIANTS, materialise
    from legorl import models

    monkeypatch.setenv("LEGORL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "BUNDLED", dict(models.BUNDLED))  # materialise registers its variant
    committed = models.resolve_model("harness-qwen3")
    quick = models.BUNDLED["quickstart-qwen3"]
    assert (committed / "tokenizer.json").read_bytes() == (quick / "tokenizer.json").read_bytes()
    assert json.loads((committed / "config.json").read_text())["vocab_size"] == 512
    old = materialise("bpe4096+gain1.5", VARIANTS["bpe4096+gain1.5"], tmp_path / "out")
    assert (old / "tokenizer.json").read_bytes() == (models.TOKENIZER_DIR / "tokenizer.json").read_bytes()
    assert json.loads((old / "config.json").read_text())["vocab_size"] == 4096
    assert json.loads((old / models.INIT_FILE).read_text())["qk_norm_gain"] == 1.5
