"""Random chat conversations (system, user, assistant with tool calls and reasoning, tool
results) for the renderer parity tests: the incremental renderer (tests/proxy/test_render.py)
and the model's own templates (tests/proxy/test_template_render.py)."""

from __future__ import annotations

import random


def random_conversation(rng: random.Random) -> list[dict]:
    words = ["def", "foo", "(x):", "\n", "  ", "return", "x+1", "héllo", "😀", "{}", '"q"', "\t", "ls -la"]

    def text() -> str:
        return "".join(rng.choice(words) + rng.choice([" ", "", "\n"]) for _ in range(rng.randint(0, 12)))

    msgs: list[dict] = []
    if rng.random() < 0.8:
        msgs.append({"role": "system", "content": text()})
    msgs.append({"role": "user", "content": text()})
    for _ in range(rng.randint(0, 4)):
        calls = [
            {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "%s"}' % rng.choice(["ls", "pwd", "cat a"])},
            }
            for k in range(rng.randint(0, 2))
        ]
        m = {"role": "assistant", "content": text()}
        if calls:
            m["tool_calls"] = calls
        if rng.random() < 0.3:
            m["reasoning_content"] = text()
        msgs.append(m)
        for c in calls:
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": text()})
        if not calls:
            msgs.append({"role": "user", "content": text()})
    return msgs
