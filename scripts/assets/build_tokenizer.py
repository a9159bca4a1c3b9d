"""Train the small byte-level BPE tokenizer shipped in legorl/assets/tokenizer/.

No model hub is reachable here, so the tokenizer of the bundled tiny models is trained
locally on Python's own standard-library sources (code + English docstrings: the text a
coding agent reads and writes). The result is committed; rerun only to change it:

    python scripts/assets/build_tokenizer.py
"""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

from tokenizers import pre_tokenizers

from legorl.bpe import save_tokenizer, train_bpe

OUT = Path(__file__).resolve().parents[2] / "legorl" / "assets" / "tokenizer"
VOCAB_SIZE = 4096


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
    tok = train_bpe(corpus(), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), VOCAB_SIZE)
    save_tokenizer(tok, OUT, model_max_length=32768)
    print(f"vocab {tok.get_vocab_size()} -> {OUT}")


if __name__ == "__main__":
    main()
