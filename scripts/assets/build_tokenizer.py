"""Train the small byte-level BPE tokenizer shipped in legorl/assets/tokenizer/.

No model hub is reachable here, so the tokenizer of the bundled tiny models is trained
locally on Python's own standard-library sources (code + English docstrings: the text a
coding agent reads and writes). The result is committed; rerun only to change it:

    python scripts/assets/build_tokenizer.py
"""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = Path(__file__).resolve().parents[2] / "legorl" / "assets" / "tokenizer"
VOCAB_SIZE = 4096
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def corpus(limit_bytes: int = 12_000_000) -> list[str]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    random.Random(0).shuffle(files)
    texts, total = [], 0
    for f in files:
        try:
            t = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(t)
        total += len(t)
        if total > limit_bytes:
            break
    return texts


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(ADDED),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.add_tokens(ADDED)
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    template = (Path(__file__).parent / "chat_template.jinja").read_text()
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 32768,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    print(f"vocab {tok.get_vocab_size()} -> {OUT}")


if __name__ == "__main__":
    main()
