"""Train and save a byte-level BPE tokenizer in the shape LEGO-RL's models expect.

Two tokenizers are built this way: the bundled tiny models' (`scripts/assets/build_tokenizer.py`,
4096 tokens of Python's standard library) and the quickstart's (512 tokens of
its own conversations; committed with `legorl/assets/models/quickstart-qwen3`, built by a script
that rendered the quickstart's dialogues in process and was removed with that parallel loop). They differ in corpus,
size, pre-tokenizer and context
length; what they share lives here, so that both stay drop-in for the proxy: the same special
and added tokens (the renderer and the tool-call parser look for them), byte-level decoding
(any text encodes), and the same `tokenizer_config.json` (our chat template, eos
`<|im_end|>`, no bos).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
CHAT_TEMPLATE = Path(__file__).resolve().parent / "assets" / "chat_template.jinja"  # shipped in the wheel


def train_bpe(texts: Iterable[str], pre_tokenizer: pre_tokenizers.PreTokenizer, vocab_size: int) -> Tokenizer:
    """A BPE of `vocab_size` tokens in all: SPECIAL first, ADDED last, learned merges between."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens(ADDED)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    """`tokenizer.json` and the `tokenizer_config.json` that `transformers` loads it with."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE.read_text(),
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
