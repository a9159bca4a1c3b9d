"""Messages → prompt ids with the model's own Jinja chat template, exact and incremental.

`apply_chat_template` renders a conversation to text with the template shipped with the
tokenizer, then tokenises the text. This renderer does the same two steps, made cheap:

1. **Rendering** uses the very template environment transformers compiles (sandboxed
   Jinja, its `tojson`, `raise_exception`, `strftime_now`), with the same inputs
   (None-valued keys dropped, reasoning aliased as `reasoning_content`/`thinking`, the
   special-token names as variables). The whole conversation is rendered on every request:
   only the template knows what it does with history (Qwen3/Qwen3.5/GLM drop or keep
   reasoning depending on later messages, gpt-oss drops analysis once a final answer
   exists), so no per-message shortcut is safe.
2. **Tokenising** splits the text in front of every added token and tokenises each piece
   through a bounded cache. The tokenizer extracts added tokens before normalising and
   pre-tokenising, so pieces that start at an added token tokenise exactly as in the whole
   text (checked once per tokenizer on a probe text; a tokenizer for which it does not hold
   is tokenised whole). A long conversation that grew by one message costs one small
   tokenisation, not the whole context.

**Splicing, and the rule for templates that rewrite history.** A completion's ids are
what the policy sampled; the template's rendering of the same message may differ (other
BPE merges, re-serialised JSON, dropped reasoning, harmony's `<|return|>` written back
as `<|end|>`). The session keeps, for each recent policy turn, the prompt text, its ids
and the sampled ids. A new request reuses them only when

- its rendered text starts with that turn's rendered prompt text (the template did not
  change anything before the reply), and
- the template's rendering of the reply, up to the end-of-message token the policy
  sampled (the k-th such token when it sampled k), parses — with the family's own
  parser — to the same content, reasoning and tool calls as the sampled completion.

Then the prompt is that turn's prompt ids + its sampled ids + the tokens of the rest of
the text, and the turn stays in its segment. Otherwise the prompt is the template's own
rendering, token for token what `apply_chat_template` gives: the model sees what it
would see in deployment, the new prompt no longer extends the previous turn, and
`assemble` starts a new segment. Each segment trains only on ids the engine saw (its
prompt) and sampled (its completion), so a rewrite costs trainer compute, never
correctness. `tests/proxy/test_template_render.py` checks both paths against
`apply_chat_template` on the published templates.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from legorl.proxy.chatml_renderer import TOOLS_POSTAMBLE, TOOLS_PREAMBLE
from legorl.proxy.completion import ParsedCompletion
from legorl.proxy.errors import bad_request
from legorl.proxy.renderer import ChatRequest, RenderState, assistant_key
from legorl.proxy.toolcalls import parse_completion

_TAG = "\ue000LEGORL_CONTINUE\ue001"  # marks the continued final message (private-use code points)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_END_TOKENS = (
    "<|im_end|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|user|>",
    "<|observation|>",
    "</s>",
)


class TemplateError(ValueError):
    """The chat template has a shape the proxy cannot render faithfully (with what to do)."""


def compile_template(source: str) -> Any:
    """The template compiled in transformers' own sandboxed environment (same filters,
    globals and extensions), with attribute lookups made cheap where that cannot change
    their result (`_fast_getattr`)."""
    import functools
    import types

    import jinja2.runtime
    import jinja2.utils
    from transformers.utils.chat_template_utils import _compile_jinja_template

    env = _compile_jinja_template(source).environment.overlay()
    safe = {jinja2.runtime.LoopContext, jinja2.utils.Namespace, str}
    if isinstance(env.globals.get("namespace"), type):  # transformers' own Namespace subclass
        safe.add(env.globals["namespace"])
    # generated code calls environment.getattr: an instance attribute takes precedence
    env.getattr = types.MethodType(functools.partial(_fast_getattr, safe=frozenset(safe)), env)
    return env.from_string(source)


_DICT_ATTRS = frozenset(dir(dict))


def _fast_getattr(env: Any, obj: Any, attribute: str, *, safe: frozenset[type]) -> Any:
    """The sandbox's `getattr` without its cost on the objects a chat template reads most.

    For a plain dict the sandbox first tries the attribute (only dict's own methods exist),
    fails with an exception, then returns the item: for any other name this goes straight
    to the item. A str, loop or namespace attribute not starting with `_` is safe by the
    sandbox's own rules (immutable, or Jinja's own types), so it is read directly. Any other
    object or name takes the sandbox's path. About a fifth of a render."""
    kind = type(obj)
    if kind is dict and attribute not in _DICT_ATTRS:
        if attribute in obj:
            return obj[attribute]
        return env.undefined(obj=obj, name=attribute)
    if kind in safe and not attribute.startswith("_"):
        try:
            return getattr(obj, attribute)
        except AttributeError:
            return env.undefined(obj=obj, name=attribute)
    return type(env).getattr(env, obj, attribute)


@dataclass
class TemplateShape:
    """What the probes found out about a template (see `probe_shape`)."""

    family: str  # tool-call format: hermes | qwen3_coder | glm45 | harmony
    gen_prompt: str  # text add_generation_prompt appends after a user message
    starts_in_reasoning: bool  # the generation prompt opens a think block
    renders_tools: bool  # False: tools go into the system prompt by our shim (SmolLM2)
    renders_tool_calls: bool  # False: assistant tool calls become text by our shim


def detect_family(source: str) -> str | None:
    if "<|channel|>" in source and "<|start|>" in source:
        return "harmony"
    if "<arg_key>" in source:
        return "glm45"
    if "<function=" in source:
        return "qwen3_coder"
    if "<tool_call>" in source:
        return "hermes"
    return None


def _as_user(m: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": _text_of_content(m.get("content"))}


def _text_of_content(c: Any) -> str:
    if isinstance(c, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in c)
    return "" if c is None else str(c)


def _merged_runs(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in msgs:
        if out and out[-1].get("role") == m.get("role") and not m.get("tool_calls"):
            prev = out[-1]
            out[-1] = {
                **prev,
                "content": _text_of_content(prev.get("content")) + "\n" + _text_of_content(m.get("content")),
            }
        else:
            out.append(m)
    return out


def _rewrites(msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[tuple[str, tuple[Any, Any]]]:
    """(construct, the request with only that construct rewritten plainly), for the
    constructs a request can carry that chat templates are known to refuse."""
    out: list[tuple[str, tuple[Any, Any]]] = []
    if msgs and msgs[0].get("role") in ("system", "developer"):
        rest = msgs[1:]
        head = _text_of_content(msgs[0].get("content"))
        if rest and rest[0].get("role") == "user":
            first = {**rest[0], "content": head + "\n\n" + _text_of_content(rest[0].get("content"))}
            folded = [first, *rest[1:]]
        else:
            folded = [{"role": "user", "content": head}, *rest]
        out.append((f"a {msgs[0]['role']!r} message", (folded, tools)))
    if any(m.get("role") == "tool" for m in msgs):
        out.append(("a 'tool' message", ([_as_user(m) if m.get("role") == "tool" else m for m in msgs], tools)))
    if any(m.get("tool_calls") for m in msgs):
        plain = [{k: v for k, v in m.items() if k != "tool_calls"} for m in msgs]
        out.append(("an assistant message with tool calls", (plain, tools)))
    if tools:
        out.append(("tool definitions", (msgs, None)))
    if any(a.get("role") == b.get("role") for a, b in pairwise(msgs)):
        out.append(("two consecutive messages of the same role", (_merged_runs(msgs), tools)))
    return out


class TemplateRenderer:
    """Renders ChatRequests with a tokenizer's own chat template (see the module docstring)."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None, cache_size: int = 50_000) -> None:
        self.tokenizer = tokenizer
        source = chat_template or getattr(tokenizer, "chat_template", None)
        if isinstance(source, dict):
            source = source.get("default")
        if not source:
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template: "
                "the proxy renders prompts only with the model's own template"
            )
        self.source: str = source
        self._tpl = compile_template(source)
        self._fast = getattr(tokenizer, "_tokenizer", None)
        self._special = {k: v for k, v in tokenizer.special_tokens_map.items()}
        added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        self._split_re = re.compile("|".join(re.escape(t) for t in added)) if added else None
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_size = cache_size
        vocab = tokenizer.get_vocab()
        self.end_tokens = {t: vocab[t] for t in _END_TOKENS if t in vocab}
        eos = set()
        for t in ("<|im_end|>", "<|endoftext|>", "<|return|>", "<|call|>", "<|user|>", "<|observation|>"):
            if t in vocab and t in self.source:
                eos.add(vocab[t])
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_ids = eos
        self.shim = ToolsShim.for_tokenizer(tokenizer)
        self.shape = probe_shape(self)
        self.tool_format = self.shape.family
        self.starts_in_reasoning = self.shape.starts_in_reasoning
        self._chunked = self._chunking_is_exact()

    # -- text -----------------------------------------------------------------------
    def _prepare(self, req: ChatRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        msgs: list[dict[str, Any]] = []
        for m in req.messages:
            d = {k: v for k, v in m.items() if v is not None}
            reasoning = next((d[k] for k in _REASONING_FIELDS if d.get(k) is not None), None)
            if reasoning is not None:  # what transformers does: gpt-oss reads `thinking`
                d = {"thinking": reasoning, **d, "reasoning_content": reasoning}
            if d.get("tool_calls"):
                d["tool_calls"] = [_args_as_object(c) for c in d["tool_calls"]]
            msgs.append(d)
        tools = req.tools or None
        shape = getattr(self, "shape", None)
        if shape is not None and not shape.renders_tool_calls:
            msgs = [
                _calls_as_text(m, self.shim) if m.get("role") == "assistant" and m.get("tool_calls") else m
                for m in msgs
            ]
        if shape is not None and tools and not shape.renders_tools:
            msgs = _tools_in_system(msgs, tools, self.shim)
        return msgs, tools

    def _render(self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        import jinja2

        try:
            return self._tpl.render(
                messages=msgs, tools=tools, documents=None, add_generation_prompt=gen, **self._special
            )
        except (jinja2.TemplateError, TypeError) as e:  # the template refuses this request (as transformers would)
            construct = self._refused_construct(msgs, tools, gen)
            raise bad_request(
                f"model {self.model_name!r}: its chat template cannot render {construct} ({type(e).__name__}: {e})"
            ) from e

    @property
    def model_name(self) -> str:
        """The model's name as configured (`load_tokenizer` records it), else its directory."""
        name = getattr(self.tokenizer, "legorl_model", None)
        return str(name or getattr(self.tokenizer, "name_or_path", "?")).rstrip("/").rsplit("/", 1)[-1]

    def _refused_construct(self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        """Which construct of the request the template refuses: the first one whose plain
        rewrite renders (only on the error path, so a few extra renders cost nothing)."""
        for name, (m, t) in _rewrites(msgs, tools):
            try:
                self._tpl.render(messages=m, tools=t, documents=None, add_generation_prompt=gen, **self._special)
            except Exception:
                continue
            return name
        roles = ", ".join(dict.fromkeys(str(m.get("role")) for m in msgs))
        return f"this request (roles: {roles}{'; tool definitions' if tools else ''})"

    def render_text(self, req: ChatRequest) -> str:
        msgs, tools = self._prepare(req)
        if req.add_generation_prompt or not msgs or msgs[-1].get("role") != "assistant":
            return self._render(msgs, tools, req.add_generation_prompt)
        # continue the final assistant message: render it closed, cut at its end (transformers' rule)
        last = dict(msgs[-1])
        last["content"] = (last.get("content") or "") + _TAG
        text = self._render([*msgs[:-1], last], tools, False)
        at = text.rfind(_TAG)
        if at < 0:
            raise TemplateError("this chat template drops the final assistant message: it cannot be continued")
        return text[:at]

    # -- ids ------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def pieces(self, text: str, start: int = 0) -> list[int]:
        """Offsets where a piece begins (each added token starts one), from `start`."""
        if self._split_re is None:
            return [start]
        out = [start]
        for m in self._split_re.finditer(text, start):
            if m.start() > out[-1]:
                out.append(m.start())
        return out

    def encode_chunks(self, text: str, start: int = 0, marks: list[tuple[int, int]] | None = None) -> list[int]:
        """Token ids of `text[start:]`, equal to tokenising it whole (module docstring,
        point 2). `marks`, when given, receives (piece offset, ids before it) pairs."""
        if not self._chunked:
            return self.encode(text[start:])
        ids: list[int] = []
        cache = self._cache
        offs = self.pieces(text, start)
        offs.append(len(text))
        for a, b in pairwise(offs):
            piece = text[a:b]
            if not piece:
                continue
            if marks is not None:
                marks.append((a, len(ids)))
            hit = cache.get(piece)
            if hit is None:
                hit = cache[piece] = self.encode(piece)
                if len(cache) > self._cache_size:
                    cache.popitem(last=False)
            ids += hit
        return ids

    def canonical_ids(self, text: str, state: RenderState | None) -> list[int]:
        """`encode_chunks(text)`, reusing the ids of the longest piece-aligned prefix this
        session's previous canonical rendering shares with `text` (exact: pieces tokenise
        independently), so a grown conversation tokenises only its new pieces."""
        prev = state.canon if state is not None else None
        base_ids: list[int] = []
        start = 0
        if prev is not None and self._chunked:
            ptext, pids, pmarks = prev
            lo, hi = 0, len(pmarks) - 1  # the last mark whose prefix `text` shares (monotone)
            while lo <= hi:
                mid = (lo + hi) // 2
                if text.startswith(ptext[: pmarks[mid][0]]):
                    lo = mid + 1
                else:
                    hi = mid - 1
            # an added token must begin a piece at `start` in the new text too
            if hi > 0 and self._split_re is not None and self._split_re.match(text, pmarks[hi][0]):
                start, n = pmarks[hi]
                base_ids = pids[:n]
                marks = pmarks[:hi]  # marks before `start`; the piece at `start` is re-read
            else:
                marks = []
        else:
            marks = []
        more: list[tuple[int, int]] = []
        tail = self.encode_chunks(text, start, more)
        ids = base_ids + tail
        if state is not None:
            state.canon = (text, ids, marks + [(a, n + len(base_ids)) for a, n in more])
        return ids

    def _chunking_is_exact(self) -> bool:
        probe = self.render_text(ChatRequest(_PROBE, _PROBE_TOOLS if self.shape.renders_tools else []))
        probe += " x\n\n  y 12345 héllo 😀\n"
        saved, self._chunked = getattr(self, "_chunked", True), True
        try:
            return self.encode_chunks(probe) == self.encode(probe)
        finally:
            self._chunked = saved
            self._cache.clear()

    # -- whole request ----------------------------------------------------------------
    def render(self, req: ChatRequest, state: RenderState | None = None) -> list[int]:
        text = self._text_for(req, state)
        ids = None
        if state is not None and state.snapshots:
            ids = self._splice(text, state)
        if ids is None:
            ids = self.canonical_ids(text, state)
        if state is not None:
            state.note_prompt(ids, text)
        return ids

    def _text_for(self, req: ChatRequest, state: RenderState | None) -> str:
        """The rendered text; a session resending exactly its previous request (a retry,
        the overhead bench) reuses it: same input, same output."""
        last = state.last_request if state is not None else None
        if (
            last is not None
            and last[0] == req.add_generation_prompt
            and last[1] == req.messages
            and last[2] == req.tools
        ):
            return last[3]
        text = self.render_text(req)
        if state is not None:
            state.last_request = (req.add_generation_prompt, req.messages, req.tools, text)
        return text

    def _splice(self, text: str, state: RenderState) -> list[int] | None:
        for snap in reversed(state.snapshots):
            if not text.startswith(snap.prompt_text):
                continue
            rest = text[len(snap.prompt_text) :]
            end = self._reply_end(rest, snap.completion_ids)
            if end is None:
                continue
            stop_id, at = end
            reply = rest[:at]
            parsed = self.parse(reply[: len(reply) - len(self.tokenizer.convert_ids_to_tokens(stop_id))])
            if _key(parsed) != snap.key:
                continue
            sampled = (
                snap.completion_ids
                if snap.completion_ids and snap.completion_ids[-1] == stop_id
                else [*snap.completion_ids, stop_id]
            )
            return [*snap.prompt_ids, *sampled, *self.encode_chunks(rest[at:])]
        return None

    def _reply_end(self, rest: str, completion: list[int]) -> tuple[int, int] | None:
        """(end token id, offset just past it) of the reply at the start of `rest`."""
        last = completion[-1] if completion else None
        names = {v: k for k, v in self.end_tokens.items()}
        if last in names:
            tok, k = names[last], completion.count(last)
        else:  # truncated or stopped by a stop string: the template closes the message itself
            found = [(rest.find(t), t) for t in self.end_tokens if rest.find(t) >= 0]
            if not found:
                return None
            tok, k = min(found)[1], 1
        at = -1
        for _ in range(k):
            at = rest.find(tok, at + 1)
            if at < 0:
                return None
        return self.end_tokens[tok], at + len(tok)

    def parse(self, text: str) -> ParsedCompletion:
        """Parse completion text (no end-of-turn token) in this template's family format."""
        return parse_completion(text, self.tool_format, starts_in_reasoning=self.shape.starts_in_reasoning)

    def count(self, req: ChatRequest) -> int:
        return len(self.encode_chunks(self.render_text(req)))


def _key(p: ParsedCompletion) -> tuple:
    return assistant_key(p.content, p.reasoning, [(c.name, c.arguments) for c in p.tool_calls])


# -- probes ---------------------------------------------------------------------------
_PROBE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {"name": "probe_fn", "description": "d", "parameters": {"type": "object", "properties": {}}},
    }
]


def probe_shape(r: TemplateRenderer) -> TemplateShape:
    """Find the generation prompt and the tool format; refuse shapes we cannot serve."""
    tpl, special, src = r._tpl, r._special, r.source

    def render(msgs: list[dict[str, Any]], gen: bool, tools: list | None = None) -> str:
        try:
            return tpl.render(messages=msgs, tools=tools, documents=None, add_generation_prompt=gen, **special)
        except Exception as e:  # the harnesses' requests carry what the probe does: a clear refusal now
            raise TemplateError(
                f"model {r.model_name!r}: its chat template cannot render {r._refused_construct(msgs, tools, gen)}, "
                f"which harness requests carry ({type(e).__name__}: {e})"
            ) from e

    closed, opened = render(_PROBE, False), render(_PROBE, True)
    if not opened.startswith(closed) or opened == closed:
        raise TemplateError(
            "unknown chat template shape: add_generation_prompt does not append a generation prompt "
            "after the conversation; the proxy refuses to guess how this model starts a reply"
        )
    gen = opened[len(closed) :]
    hist = render([*_PROBE, {"role": "assistant", "content": "A"}], False)
    if "A" not in hist[len(closed) :]:
        raise TemplateError("unknown chat template shape: an assistant message is not rendered after the prompt")
    renders_tools = "probe_fn" in render(_PROBE, True, _PROBE_TOOLS)
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "probe_fn", "arguments": {"k": "v"}}}],
    }
    try:
        with_call = render(
            [
                *_PROBE,
                call,
                {"role": "tool", "tool_call_id": "c1", "content": "R"},
            ],
            True,
            _PROBE_TOOLS,
        )
        renders_calls = "probe_fn" in with_call[len(render(_PROBE, False, _PROBE_TOOLS)) :]
    except TemplateError:
        renders_calls = False
    family = detect_family(src)
    if family is None:
        if renders_tools or renders_calls:
            raise TemplateError(
                "unknown chat template shape: it renders tools but in none of the tool-call formats the "
                "proxy parses (hermes <tool_call> JSON, qwen3_coder XML, GLM <arg_key>, harmony); "
                "refusing rather than guessing how the model writes a call"
            )
        family = "hermes"  # no tool support in the template: our shim writes hermes blocks
    stripped = gen.rstrip("\n")
    return TemplateShape(
        family=family,
        gen_prompt=gen,
        starts_in_reasoning=stripped.endswith("<think>"),
        renders_tools=renders_tools,
        renders_tool_calls=renders_calls,
    )


_ARGS_CACHE: dict[str, Any] = {}


def _args_as_object(call: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments as an object: the dialects carry them as JSON text, templates
    iterate over them (Qwen3.5, GLM) or `tojson` them (gpt-oss), as vLLM passes them."""
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    text = fn["arguments"]
    args = _ARGS_CACHE.get(text)
    if args is None:
        try:
            args = json.loads(text)
        except json.JSONDecodeError:
            return call
        if len(_ARGS_CACHE) > 4096:
            _ARGS_CACHE.clear()
        _ARGS_CACHE[text] = args
    if not isinstance(args, dict):
        return call
    return {**call, "function": {**fn, "arguments": args}}  # shared: the sandbox cannot mutate it


# -- the shim for templates without tool support (SmolLM2) ------------------------------
@dataclass(frozen=True)
class ToolsShim:
    """How tools reach a model whose template renders none (appended to the system prompt)
    and how its replayed calls are written into the assistant text.

    The default is the hermes block of the Qwen templates; a model directory may carry its
    own in `legorl_tools.json` (`{"system": "...{tools}...", "calls": "json_list"}`), as the
    converted SmolLM2 does with its documented function-calling prompt."""

    system: str = ""  # '{tools}' is replaced by the tools' JSON; empty: the hermes block
    calls: str = "json_object"  # json_object: one <tool_call> block per call; json_list: one block, a list

    @staticmethod
    def for_tokenizer(tokenizer: Any) -> ToolsShim:
        from pathlib import Path

        path = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "legorl_tools.json"
        if not path.is_file():
            return ToolsShim()
        data = json.loads(path.read_text())
        return ToolsShim(system=data.get("system", ""), calls=data.get("calls", "json_object"))

    def block(self, tools: list[dict[str, Any]]) -> str:
        if self.system:
            return self.system.replace("{tools}", json.dumps([t.get("function", t) for t in tools], ensure_ascii=False))
        return (
            TOOLS_PREAMBLE
            + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
            + TOOLS_POSTAMBLE.removesuffix("<|im_end|>\n")
        )

    def calls_text(self, calls: list[dict[str, Any]]) -> str:
        objs = []
        for c in calls:
            fn = c.get("function", c)
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            objs.append({"name": fn.get("name"), "arguments": args})
        if self.calls == "json_list":
            return "<tool_call>" + json.dumps(objs, ensure_ascii=False) + "</tool_call>"
        return "\n".join("<tool_call>\n" + json.dumps(o, ensure_ascii=False) + "\n</tool_call>" for o in objs)


def _calls_as_text(m: dict[str, Any], shim: ToolsShim) -> dict[str, Any]:
    content = m.get("content") or ""
    d = {k: v for k, v in m.items() if k != "tool_calls"}
    d["content"] = content + ("\n" if content else "") + shim.calls_text(m["tool_calls"])
    return d


def _tools_in_system(msgs: list[dict[str, Any]], tools: list[dict[str, Any]], shim: ToolsShim) -> list[dict[str, Any]]:
    block = shim.block(tools)
    if msgs and msgs[0].get("role") == "system":
        first = dict(msgs[0])
        first["content"] = (first.get("content") or "") + "\n\n" + block
        return [first, *msgs[1:]]
    return [{"role": "system", "content": block}, *msgs]
