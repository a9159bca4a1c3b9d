"""bench/copy_attention.py reads a checkpoint at the query that predicts a fix line's second name."""

from __future__ import annotations

import pytest

from bench.copy_attention import probe

FIX = "sed -i 's|^def pow.*|def pow(a, b): return a ** b|' calc.py"


@pytest.fixture(scope="module")
def tiny() -> tuple[object, object]:
    from transformers import AutoModelForCausalLM

    from legorl.models import load_tokenizer, resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-qwen3"), attn_implementation="eager").eval()
    return model, load_tokenizer("tiny-qwen3")


def test_a_fix_line_is_read_at_its_second_name(tiny: tuple[object, object]) -> None:
    model, tok = tiny
    prompt = tok.encode("FAIL pow: got 9, expected 8\n", add_special_tokens=False)
    row = probe(model, tok, prompt, tok.encode(FIX, add_special_tokens=False))
    assert row is not None and row["name"] == tok.decode(tok.encode(" pow", add_special_tokens=False)[:1]).strip()
    assert 0.0 <= row["p_copy"] <= 1.0
    assert row["p_copy"] == pytest.approx(row["p_copy_at_zero"], abs=1e-4)  # rotary attention is relative
    cfg = model.config  # type: ignore[attr-defined]
    assert len(row["heads"]) == cfg.num_hidden_layers and len(row["heads"][0]) == cfg.num_attention_heads
    assert all(0.0 <= h["first4"] <= h["max"] * 4 + 1e-6 for layer in row["heads"] for h in layer)


def test_a_turn_without_a_fix_line_is_skipped(tiny: tuple[object, object]) -> None:
    model, tok = tiny
    assert probe(model, tok, [1, 2, 3], tok.encode("python3 test_calc.py", add_special_tokens=False)) is None
