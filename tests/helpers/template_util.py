"""Tokenizers for the chat-template parity tests (`tests/fixtures/`).

- Qwen2.5 / Qwen3 / Qwen3.5 / Qwen3-Coder: the real Qwen2 byte-level BPE (151,643 merges
  vocabulary, `fixtures/tokenizers/qwen2-*.xz`) plus the Qwen3 added tokens at their real ids.
- gpt-oss and GLM-4.5: their real added tokens (harmony's `<|start|>`/`<|channel|>`/...,
  GLM's `<|user|>`/`<arg_key>`/...) on the bundled byte-level BPE: their own BPE files are
  not reachable here. The templates are the published ones; the ids of ordinary text are
  the stand-in's, which is enough to test what the renderer does (template text, added-
  token splitting, splicing), since both sides tokenise with the same tokenizer.
"""

from __future__ import annotations

import json
import lzma
from functools import cache
from pathlib import Path

from tests.helpers.paths import FIXTURES

FIXTURES = FIXTURES
TEMPLATES = FIXTURES / "chat_templates"


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


@cache
def _qwen_dir() -> Path:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="legorl-qwen2-bpe-"))
    for f in ("qwen2-vocab.json", "qwen2-merges.txt"):
        (d / f.removeprefix("qwen2-")).write_bytes(lzma.decompress((FIXTURES / "tokenizers" / f"{f}.xz").read_bytes()))
    return d


def _add(tok, added_json: str, check_ids: bool) -> None:
    from tokenizers import AddedToken

    entries = json.loads((FIXTURES / "tokenizers" / added_json).read_text())
    for e in sorted(entries, key=lambda e: e["id"]):
        if e["content"] in tok.get_vocab():
            continue
        tok.add_tokens([AddedToken(e["content"], special=e["special"], normalized=False)], special_tokens=e["special"])
        if check_ids:
            assert tok.convert_tokens_to_ids(e["content"]) == e["id"], e


def qwen_tokenizer(chat_template: str):
    from transformers import Qwen2Tokenizer

    d = _qwen_dir()
    vocab = json.loads((d / "vocab.json").read_text())
    merges = [
        tuple(line.split(" "))
        for line in (d / "merges.txt").read_text().splitlines()
        if line and not line.startswith("#version")
    ]
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token=None, pad_token=None)
    _add(tok, "qwen3_added.json", check_ids=True)
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    tok.chat_template = chat_template
    return tok


def standin_tokenizer(added_json: str, chat_template: str, eos: str):
    from legorl.models import load_tokenizer

    tok = load_tokenizer("tiny-qwen3")
    _add(tok, added_json, check_ids=False)
    tok.eos_token = eos
    tok.chat_template = chat_template
    return tok
