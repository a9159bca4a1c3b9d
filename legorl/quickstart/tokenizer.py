"""The quickstart's own small tokenizer, trained on the quickstart's conversations.

The bundled 4096-token BPE (trained on Python's standard library) spends ~25 tokens on
`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` and ~10 on the action fence; every one is a decode
step and a position the 1M-parameter policy must get right. A 512-token byte-level BPE
trained on what the quickstart's agent reads and writes (mini-swe-agent's messages under
our chat template: prompts, commands, test output, format errors) makes an episode a few
dozen tokens and shrinks the LM head 8×, which is what lets SFT + GSPO + three 300-episode
evaluations fit in minutes on two CPU cores. It is byte-level, so any text a harness sends
still encodes; its special and added tokens are the bundled tokenizer's, so the proxy's
renderer and tool-call parser work unchanged.

Rebuild (the result is committed next to the model config it belongs to):

    python -m legorl.quickstart.tokenizer
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from legorl.quickstart.dialogue import Dialogue, format_error_text, load_agent_config
from legorl.quickstart.expert import expert_reply
from legorl.quickstart.family import PROBLEM, make_task, run_tests_in_process

MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "models" / "quickstart-qwen3"
VOCAB_SIZE = 512
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
WORDS = r" ?[A-Za-z_]+| ?[0-9]| ?[^\sA-Za-z_0-9]+|\s+(?!\S)|\s+"
CHAT_TEMPLATE = Path(__file__).resolve().parents[2] / "scripts" / "assets" / "chat_template.jinja"


def _render(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def corpus(n_tasks: int = 2000, seed: int = 0) -> list[str]:
    """The expert's conversations on `n_tasks` tasks (seeds apart from train and held-out)."""
    cfg = load_agent_config()
    rng = random.Random(seed)
    texts = []
    for i in range(n_tasks):
        task = make_task(50_000_000 + i)
        dialogue = Dialogue(cfg, PROBLEM)
        out, code = run_tests_in_process(task, task.source())
        dialogue.on_reply(expert_reply(None, rng.random(), 0.5), "stop")
        dialogue.on_output({"output": out, "returncode": code, "exception_info": ""})
        dialogue.messages.append({"role": "assistant", "content": expert_reply(out, rng.random(), 0.5)})
        texts.append(_render(dialogue.messages))
    errors = [format_error_text(cfg, [], f"Expected exactly 1 action, found {n}.", "stop") for n in (0, 2)]
    texts.append(_render([{"role": "user", "content": e} for e in errors]))
    return texts


def build(out_dir: Path = MODEL_DIR, vocab_size: int = VOCAB_SIZE) -> Path:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # GPT-2's split, except that `_` joins words (so COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT and
    # mswea_bash_command can each become one token) and digits stand alone.
    split = pre_tokenizers.Split(Regex(WORDS), behavior="isolated")
    tok.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.add_tokens(ADDED)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE.read_text(),
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return out_dir


if __name__ == "__main__":
    print(f"tokenizer -> {build()}")
