"""`ProxyContext`: everything a request needs, built once per server (config, engine,
renderer, sessions, the completion format, sampling params). Its own module so that the ASGI
app (`app.py`) and the per-turn pipeline (`pipeline.py`) both depend on it and not on each
other.
"""

from __future__ import annotations

import re
from typing import Any

from legorl.engine.base import Engine
from legorl.proxy.config import ProxyConfig
from legorl.proxy.render_cache import OffLoopRenderer, bound_renderer
from legorl.proxy.renderer import Renderer
from legorl.proxy.sessions import SessionRegistry
from legorl.types import SamplingParams


class ProxyContext:
    """Everything a request needs, built once per server."""

    def __init__(self, cfg: ProxyConfig, engine: Engine, renderer: Renderer, sessions: SessionRegistry) -> None:
        self.cfg = cfg
        self.engine = engine
        self.renderer = renderer
        self.sessions = sessions
        bound_renderer(renderer, cfg.render_cache_bytes)
        self.offload = OffLoopRenderer(renderer)
        self.eos_ids = frozenset(renderer.eos_ids)
        # the completion format: the config's, or (`auto`) the one the model's template writes
        self.tool_format = renderer.tool_format if cfg.tool_format == "auto" else cfg.tool_format
        self.starts_in_reasoning = bool(renderer.starts_in_reasoning)
        tok = renderer.tokenizer
        self.backend = getattr(tok, "backend_tokenizer", None) or tok  # a tokenizers.Tokenizer
        self.max_context = min(cfg.max_context, engine.max_context)
        self.side_models = frozenset(cfg.side_call_models)
        self.side_regex = compile_side_regex(cfg.side_call_patterns)
        self._params: dict[tuple[int, tuple[str, ...]], tuple[SamplingParams, dict[str, Any]]] = {}

    def sampling(self, max_tokens: int, stop: tuple[str, ...]) -> SamplingParams:
        """The trainer's sampling params for this cap and these stop strings (cached)."""
        hit = self._params.get((max_tokens, stop))
        if hit is None:
            c = self.cfg
            p = SamplingParams(
                temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, max_tokens=max_tokens, stop=stop, seed=c.seed
            )
            hit = (p, p.to_dict())
            if len(self._params) > 4096:
                self._params.clear()
            self._params[(max_tokens, stop)] = hit
        return hit[0]

    def sampling_dict(self, params: SamplingParams | None) -> dict[str, Any]:
        if params is None:
            return {}
        hit = self._params.get((params.max_tokens, params.stop))
        return dict(hit[1]) if hit is not None and hit[0] is params else params.to_dict()


def compile_side_regex(patterns: list[str]) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
