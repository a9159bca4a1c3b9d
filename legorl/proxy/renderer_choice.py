"""Which renderer a tokenizer gets, and the doctor's check that it renders like the model's
own chat template.

Two renderers implement `renderer.Renderer` (`chatml_renderer.ChatMLRenderer`: the bundled
ChatML template, hand-rendered; `template.TemplateRenderer`: any published template, run
through its Jinja). Choosing between them is this module's job, above both, so neither
imports the other's chooser.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from legorl.models import TOKENIZER_DIR
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.renderer import ChatRequest, Renderer
from legorl.proxy.template import TemplateError, TemplateRenderer

# the one tool of the template probes (here and in `legorl doctor`'s incremental-render check)
PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def make_renderer(tokenizer: Any) -> Renderer:
    """The renderer for a tokenizer: the ChatML one for the bundled template (same ids,
    faster), else the template renderer, which refuses a template shape it cannot serve
    (`legorl.proxy.template.TemplateError`)."""
    if getattr(tokenizer, "chat_template", None) == _bundled_template(str(TOKENIZER_DIR)):
        return ChatMLRenderer(tokenizer)
    return TemplateRenderer(tokenizer)


_BUNDLED: dict[str, str | None] = {}


def _bundled_template(tokenizer_dir: str) -> str | None:
    if tokenizer_dir not in _BUNDLED:
        cfg = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text())
        _BUNDLED[tokenizer_dir] = cfg.get("chat_template")
    return _BUNDLED[tokenizer_dir]


def round_trip(tokenizer: Any) -> str:
    """`legorl doctor`'s check: the renderer this tokenizer gets reproduces
    `apply_chat_template` (ids) on a conversation with tools, a tool call and its result.
    Raises TemplateError (unknown shape, or a difference) with what to do."""
    r = make_renderer(tokenizer)
    msgs = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    tools = PROBE_TOOLS
    shape = getattr(r, "shape", None)
    ours = r.render(ChatRequest(msgs, tools))
    if shape is not None and not (shape.renders_tools and shape.renders_tool_calls):
        ref_msgs, _ = r._prepare(ChatRequest(msgs, tools))  # the shim's input is the reference's
        theirs = tokenizer.apply_chat_template(ref_msgs, add_generation_prompt=True, tokenize=True)
        how = "tools shimmed into the system prompt"
    else:
        theirs = tokenizer.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=True)
        how = "tools rendered by the template"
    theirs = list(theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs)
    if ours != theirs:
        k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise TemplateError(
            f"the proxy's rendering and apply_chat_template differ at token {k}: "
            f"{tokenizer.decode(ours[k : k + 8])!r} vs {tokenizer.decode(theirs[k : k + 8])!r}; "
            "report the template (this shape is not served faithfully)"
        )
    return f"{type(r).__name__} ({getattr(r, 'tool_format', '?')} tool calls, {how}): {len(ours)} ids equal"
