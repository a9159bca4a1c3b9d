"""The hand-written renderer of the bundled models' ChatML template (`assets/tokenizer`).

`renderer_choice.make_renderer` picks it for that template (same ids as the template, and
faster) and `template.TemplateRenderer` for every other. It implements `renderer.Renderer`.

Two things make it both exact and cheap:

1. **Piece-wise rendering.** The chat template (Qwen-style) puts a special token at the
   start of every message block, and special tokens are split off before BPE, so
   tokenising each block on its own gives exactly the ids of tokenising the whole rendered
   string. Each block's ids are cached by the block's content, so a 7k-token conversation
   that grew by one message costs one small tokenisation, not 7k tokens of work
   (`tests/proxy/test_render.py` checks parity with `tokenizer.apply_chat_template`).
2. **Splicing sampled ids.** An assistant message the policy produced is rendered from the
   ids that were actually sampled (`RenderState.sampled`, matched by `assistant_key`), not
   from the harness's re-serialisation of it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import orjson

from legorl.proxy.renderer import ChatRequest, RenderState, assistant_key

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


class ChatMLRenderer:
    """Renders ChatRequests to ids with a bounded block cache shared by all sessions.

    Hand-written for the bundled models' Qwen-style template (`assets/tokenizer`), which it
    reproduces exactly; `make_renderer` picks it only for that template and the template
    renderer (`legorl.proxy.template`) for every other."""

    tool_format = "hermes"
    starts_in_reasoning = False

    def __init__(self, tokenizer: Any, cache_size: int = 50_000) -> None:
        self.tokenizer = tokenizer
        self._fast = getattr(tokenizer, "_tokenizer", None)  # tokenizers.Tokenizer
        self.im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.eos_ids = {self.im_end, tokenizer.convert_tokens_to_ids("<|endoftext|>")}
        self.newline = self.encode("\n")
        self.gen_prompt = self.encode("<|im_start|>assistant\n")
        self._cache: OrderedDict[Any, list[int]] = OrderedDict()
        self._cache_size = cache_size
        self._tools_cache: dict[bytes, tuple[str, ...]] = {}

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _tools_json(self, tools: list[dict[str, Any]]) -> tuple[str, ...]:
        """Each tool as the template's `tojson` writes it, memoised on the tools' compact
        JSON: harnesses resend the same tools every call, and the stdlib encoder took
        ~100 us per request for five tool schemas."""
        try:
            key = orjson.dumps(tools)
        except TypeError:
            return tuple(json.dumps(t, ensure_ascii=False) for t in tools)
        hit = self._tools_cache.get(key)
        if hit is None:
            if len(self._tools_cache) >= 1024:
                self._tools_cache.clear()
            hit = self._tools_cache[key] = tuple(json.dumps(t, ensure_ascii=False) for t in tools)
        return hit

    def _cached(self, key: Any, make: Any) -> list[int]:
        ids = self._cache.get(key)
        if ids is None:
            ids = self.encode(make())
            self._cache[key] = ids
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return ids

    # -- blocks ---------------------------------------------------------------------
    def _header(self, system: str | None, tools: list[dict[str, Any]]) -> list[int]:
        if not tools and system is None:
            return []
        tools_json = self._tools_json(tools)

        def make() -> str:
            if not tools:
                return f"<|im_start|>system\n{system}<|im_end|>\n"
            head = "<|im_start|>system\n" + (f"{system}\n\n" if system is not None else "")
            return head + TOOLS_PREAMBLE + "".join("\n" + t for t in tools_json) + TOOLS_POSTAMBLE

        return self._cached(("hdr", system, tools_json), make)

    @staticmethod
    def assistant_text(m: dict[str, Any]) -> str:
        """The body of an assistant block as the template writes it (no im_start/im_end)."""
        out = ""
        if m.get("reasoning_content"):
            out += "<think>\n" + m["reasoning_content"] + "\n</think>\n\n"
        content = m.get("content") or ""
        out += content
        for i, c in enumerate(m.get("tool_calls") or []):
            if i > 0 or content:
                out += "\n"
            args = c["function"]["arguments"]
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False)
            out += '<tool_call>\n{"name": "' + c["function"]["name"] + '", "arguments": ' + args + "}\n</tool_call>"
        return out

    def _assistant(self, m: dict[str, Any], state: RenderState | None, final_open: bool) -> list[int]:
        if state is not None and state.sampled and not final_open:
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
            sampled = state.sampled.get(assistant_key(m.get("content") or "", m.get("reasoning_content"), calls))
            if sampled is not None:
                body = sampled if sampled and sampled[-1] == self.im_end else [*sampled, self.im_end]
                return self.gen_prompt + body + self.newline
        text = self.assistant_text(m)
        if final_open:  # continue-final-message: no end-of-turn
            return self._cached(("asst_open", text), lambda: "<|im_start|>assistant\n" + text)
        return self._cached(("asst", text), lambda: "<|im_start|>assistant\n" + text + "<|im_end|>\n")

    # -- whole request ----------------------------------------------------------------
    def render(self, req: ChatRequest, state: RenderState | None = None) -> list[int]:
        msgs = req.messages
        system = msgs[0]["content"] if msgs and msgs[0]["role"] == "system" else None
        ids: list[int] = list(self._header(system, req.tools))
        start = 1 if system is not None else 0
        i, n = start, len(msgs)
        while i < n:
            m = msgs[i]
            role = m["role"]
            if role == "tool":
                j = i
                while j < n and msgs[j]["role"] == "tool":
                    j += 1
                contents = tuple(msgs[k].get("content") or "" for k in range(i, j))
                ids += self._cached(
                    ("tool", contents),
                    lambda c=contents: (
                        "<|im_start|>user"
                        + "".join(f"\n<tool_response>\n{x}\n</tool_response>" for x in c)
                        + "<|im_end|>\n"
                    ),
                )
                i = j
                continue
            if role == "assistant":
                final_open = i == n - 1 and not req.add_generation_prompt
                ids += self._assistant(m, state, final_open)
            else:  # user, or a system message after the first
                content = m.get("content") or ""
                ids += self._cached((role, content), lambda r=role, c=content: f"<|im_start|>{r}\n{c}<|im_end|>\n")
            i += 1
        if req.add_generation_prompt:
            ids += self.gen_prompt
        return ids

    def count(self, req: ChatRequest) -> int:
        return len(self.render(req))
