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

import random
from pathlib import Path

from legorl.quickstart.dialogue import Dialogue, format_error_text, load_agent_config
from legorl.quickstart.expert import expert_reply
from legorl.quickstart.family import PROBLEM, make_task, run_tests_in_process

MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "models" / "quickstart-qwen3"
VOCAB_SIZE = 512
WORDS = r" ?[A-Za-z_]+| ?[0-9]| ?[^\sA-Za-z_0-9]+|\s+(?!\S)|\s+"


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
    from tokenizers import Regex, pre_tokenizers

    from legorl.bpe import save_tokenizer, train_bpe

    # GPT-2's split, except that `_` joins words (so COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT and
    # mswea_bash_command can each become one token) and digits stand alone.
    split = pre_tokenizers.Split(Regex(WORDS), behavior="isolated")
    pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    save_tokenizer(train_bpe(corpus(), pre, vocab_size), out_dir, model_max_length=2048)
    return out_dir


if __name__ == "__main__":
    print(f"tokenizer -> {build()}")
