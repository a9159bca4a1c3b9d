"""Shared helpers for the proxy tests: a spying engine wrapper, the proxy the tests serve over it,
and turn checks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from legorl.engine.base import collect
from legorl.engine.scripted import ScriptedEngine
from legorl.models import load_tokenizer
from legorl.proxy.chatml_renderer import ChatMLRenderer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.server import ProxyServer
from legorl.proxy.toolcalls import parse_completion
from legorl.types import Generation, SamplingParams, TokenStep, Turn

EOS = 2  # <|im_end|> in the bundled tokenizer


@lru_cache(maxsize=1)
def tokenizer() -> Any:
    return load_tokenizer("tiny-qwen3")


@dataclass
class Call:
    prompt_ids: list[int]
    params: SamplingParams
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: Any = None


class SpyEngine:
    """Wraps an engine and keeps what it yielded for each call, to compare with the turns
    the proxy recorded (the proxy must record exactly what the engine produced)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = f"spy:{getattr(inner, 'name', '?')}"
        self.calls: list[Call] = []
        self.closed_streams = 0

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        call = Call(list(prompt_ids), params)
        self.calls.append(call)
        finished = False
        try:
            async for step in self.inner.stream(prompt_ids, params):
                if step.token_id is not None:
                    call.ids.append(step.token_id)
                    call.logprobs.append(step.logprob)
                if step.finish_reason is not None:
                    call.finish = step.finish_reason
                    finished = True
                yield step
        finally:
            if not finished:
                self.closed_streams += 1

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def close(self) -> None:
        await self.inner.close()

    def call_for(self, turn: Turn) -> Call:
        hits = [c for c in self.calls if c.prompt_ids == turn.prompt_ids and c.ids == turn.completion_ids]
        assert hits, f"turn {turn.index}: no engine call produced its prompt+completion"
        return hits[0]


@dataclass(frozen=True)
class ProxyScript:
    """What the shared `proxy` fixture (tests/conftest.py) serves: the scripted engine's replies
    (`mode` as `ScriptedEngine` takes it) and the proxy's settings beyond a free loopback port."""

    replies: Sequence[str]
    mode: str = "per_session"
    config: dict[str, Any] = field(default_factory=dict)
    standalone: bool = False


@asynccontextmanager
async def spied_proxy(engine: Any, *, standalone: bool = False, **config: Any) -> AsyncIterator[ProxyServer]:
    """A proxy on a free loopback port (ChatML, the bundled tokenizer) over `engine` wrapped in a
    `SpyEngine`, kept as `srv.spy` so a test compares each recorded turn with what was sampled."""
    spy = SpyEngine(engine)
    async with ProxyServer(
        ProxyConfig(port=0, **config), spy, ChatMLRenderer(tokenizer()), standalone=standalone
    ) as srv:
        srv.spy = spy
        yield srv


@asynccontextmanager
async def scripted_proxy(script: ProxyScript) -> AsyncIterator[ProxyServer]:
    """`spied_proxy` over the scripted engine replaying `script`."""
    engine = ScriptedEngine(list(script.replies), tokenizer(), mode=script.mode)
    async with spied_proxy(engine, standalone=script.standalone, **script.config) as srv:
        yield srv


def canonical(content: str | None, reasoning: str | None, calls: list[tuple[str, Any]]) -> tuple:
    """What a client received, up to whitespace and JSON formatting."""
    return (
        (content or "").strip(),
        (reasoning or "").strip(),
        [(name, json.loads(args) if isinstance(args, str) else args) for name, args in calls],
    )


def decoded_view(turn: Turn, fmt: str = "hermes") -> tuple:
    """The same view computed from the recorded completion ids alone."""
    ids = turn.completion_ids
    if ids and ids[-1] == EOS:
        ids = ids[:-1]
    text = tokenizer().decode(ids, skip_special_tokens=False)
    stop = turn.sampling_used.get("stop") or ()
    cut = min((text.find(s) for s in stop if s in text), default=-1)
    if cut >= 0:
        text = text[:cut]
    p = parse_completion(text, fmt)
    return canonical(p.content, p.reasoning, [(c.name, c.arguments) for c in p.tool_calls])


def check_turn(turn: Turn, engine: SpyEngine, received: tuple, usage: tuple[int, int] | None = None) -> None:
    """The recorded turn equals what the engine produced and what the client received."""
    call = engine.call_for(turn)
    assert turn.logprobs == call.logprobs
    assert turn.finish_reason == call.finish
    assert decoded_view(turn) == received, f"turn {turn.index}: client view differs from the decoded completion"
    if usage is not None:
        assert usage == (len(turn.prompt_ids), len(turn.completion_ids))
