"""One model call, dialect-independent: render → engine stream → text events → Turn.

Every dialect module turns its request body into a `Parsed` (a `ChatRequest` plus what
the harness asked for) and its response out of a `TurnRun`. The run owns everything that
must be identical across dialects: the prompt ids the engine saw, the sampling actually
used, incremental detokenisation (the text a client receives is exactly the decoding of
the recorded completion ids, minus a trailing end-of-turn token and a matched stop
string), tool-call parsing, side-call detection and the recorded `Turn`.

Hot path: this runs for every request, so it does no per-token allocation beyond one
small list of parser events, and no work at all for stop strings when there are none.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenizers.decoders import DecodeStream

from legorl.engine.base import ContextLengthExceeded, EngineError
from legorl.proxy.completion import ParsedCompletion, StreamEvent, TextDelta
from legorl.proxy.errors import ProxyError, context_too_long
from legorl.proxy.renderer import ChatRequest
from legorl.proxy.toolcalls import StreamParser, parse_completion
from legorl.types import Dialect, FinishReason, Routing, SamplingParams, TokenStep, Turn, as_routing

if TYPE_CHECKING:
    from legorl.proxy.context import ProxyContext
    from legorl.proxy.sessions import Session


@dataclass
class Parsed:
    """What a dialect module extracted from one request body."""

    chat: ChatRequest
    model: str
    stream: bool
    max_tokens: int | None = None  # the harness's cap, if any
    stop: tuple[str, ...] = ()
    requested: dict[str, Any] = field(default_factory=dict)  # sampling the harness asked for
    options: dict[str, Any] = field(default_factory=dict)  # dialect-specific (include_usage, ...)


class StopFilter:
    """Withholds text that may be the start of a stop string; cuts at a full match.

    Clients never see a stop string (OpenAI/Anthropic semantics), so a streamed delta may
    only be released once it cannot be part of one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.longest = max(len(s) for s in stops)
        self.raw = ""
        self.emitted = 0
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        if self.matched is not None:
            return ""
        self.raw += delta
        raw = self.raw
        search_from = max(0, self.emitted - self.longest + 1)
        hit, hit_stop = -1, None
        for s in self.stops:
            p = raw.find(s, search_from)
            if p >= 0 and (hit < 0 or p < hit):
                hit, hit_stop = p, s
        if hit >= 0:
            out = raw[self.emitted : hit]
            self.emitted = hit
            self.matched = hit_stop
            return out
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(raw) - self.emitted), hold, -1):
                if raw.endswith(s[:n]):
                    hold = n
                    break
        end = len(raw) - hold
        out = raw[self.emitted : end]
        self.emitted = end
        return out

    def flush(self) -> str:
        if self.matched is not None:
            return ""
        out = self.raw[self.emitted :]
        self.emitted = len(self.raw)
        return out


def _text_of(content: Any) -> str:
    return content if isinstance(content, str) else ""


class TurnRun:
    """One model call from prompt rendering to the recorded Turn."""

    def __init__(
        self, ctx: ProxyContext, session: Session, dialect: Dialect, body: dict[str, Any], parsed: Parsed
    ) -> None:
        self.ctx = ctx
        self.session = session
        self.dialect = dialect
        self.body = body
        self.parsed = parsed
        self.t_start = time.time()
        self.t_first = 0.0
        self.index = -1
        self.prompt_ids: list[int] = []
        self.completion_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish_reason = FinishReason.ABORT
        self.routed_experts: Routing | None = None
        self.result: ParsedCompletion | None = None
        self.text = ""  # the decoded completion as the client received it
        self.stop_sequence: str | None = None
        self.side_call = False
        self.params: SamplingParams | None = None
        self.policy_version = 0
        self.oldest_version: int | None = None  # per-token versions the engine reported, oldest
        self._steps: AsyncIterator[TokenStep] | None = None
        self._pending: TokenStep | None = None
        self.last_step_at: float | None = None  # when the engine last gave a step (a stalled engine is ours)
        self.recorded = False

    # -- before generation ------------------------------------------------------------
    def prepare(self, prompt_ids: list[int] | None = None) -> None:
        """Render the prompt (unless rendered already, off the loop), enforce the context
        window, choose the sampling params."""
        cfg = self.ctx.cfg
        p = self.parsed
        self.side_call = self._is_side_call()
        self.prompt_ids = self.ctx.renderer.render(p.chat, self.session.state) if prompt_ids is None else prompt_ids
        n = len(self.prompt_ids)
        if n >= self.ctx.max_context:
            raise context_too_long(self.dialect, n, self.ctx.max_context)
        max_tokens = min(cfg.max_tokens, self.ctx.max_context - n)
        if p.max_tokens is not None:
            max_tokens = min(max_tokens, p.max_tokens)
        stop = tuple(dict.fromkeys((*cfg.stop, *p.stop)))
        self.params = self.ctx.sampling(max_tokens, stop)

    def _is_side_call(self) -> bool:
        ctx = self.ctx
        if ctx.side_models and self.parsed.model in ctx.side_models:
            return True
        if ctx.side_regex is None:
            return False
        msgs = self.parsed.chat.messages
        if msgs and msgs[0]["role"] == "system" and ctx.side_regex.search(_text_of(msgs[0].get("content"))[:1000]):
            return True
        for m in reversed(msgs):
            if m["role"] == "user":
                return bool(ctx.side_regex.search(_text_of(m.get("content"))[-1000:]))
        return False

    async def start(self) -> None:
        """Start the engine and wait for its first step, so that an engine that fails at
        once is reported as a clean 502 before any response byte is sent."""
        engine = self.ctx.engine
        self.index = self.session.next_index()
        try:
            self._steps = engine.stream(self.prompt_ids, self.params)
            self._pending = await anext(self._steps)
            self.last_step_at = time.monotonic()
        except StopAsyncIteration:
            self._pending = None
        except ContextLengthExceeded:
            raise context_too_long(self.dialect, len(self.prompt_ids), self.ctx.max_context) from None
        except (ProxyError, TimeoutError):
            raise
        except Exception as e:  # noqa: BLE001 - any engine fault becomes a 502 with its text
            raise _engine_error(e) from e

    # -- generation -------------------------------------------------------------------
    def _versioned(self, step: TokenStep) -> TokenStep:
        self.last_step_at = time.monotonic()
        if step.policy_version is not None:
            old = self.oldest_version
            self.oldest_version = step.policy_version if old is None else min(old, step.policy_version)
        return step

    async def _token_steps(self) -> AsyncIterator[TokenStep]:
        if self._pending is not None:
            step, self._pending = self._pending, None
            yield self._versioned(step)
        if self._steps is None:
            return
        try:
            async for step in self._steps:
                yield self._versioned(step)
        except (ProxyError, TimeoutError):
            raise
        except Exception as e:  # noqa: BLE001
            raise _engine_error(e) from e

    async def events(self) -> AsyncIterator[list[StreamEvent]]:
        """Parser events, one batch per engine token that produced visible text."""
        ctx = self.ctx
        eos = ctx.eos_ids
        backend = ctx.backend
        decoder = DecodeStream(skip_special_tokens=False)
        parser = StreamParser(ctx.tool_format, ctx.starts_in_reasoning)
        stops = StopFilter(self.params.stop) if self.params.stop else None
        ids, lps = self.completion_ids, self.logprobs
        held: int | None = None  # an end-of-turn id, shown as text only if more tokens follow
        pieces: list[str] = []
        async for step in self._token_steps():
            tid = step.token_id
            if tid is not None:
                if not ids:
                    self.t_first = time.time()
                ids.append(tid)
                lps.append(step.logprob if step.logprob is not None else 0.0)
                text = ""
                if held is not None:
                    text = decoder.step(backend, held) or ""
                    held = None
                if tid in eos:
                    held = tid
                else:
                    text += decoder.step(backend, tid) or ""
                if text:
                    pieces.append(text)
                    if stops is not None:
                        text = stops.feed(text)
                    if text:
                        evs = parser.feed(text)
                        if evs:
                            yield evs
            if step.finish_reason is not None:
                self.finish_reason = step.finish_reason
                self.routed_experts = as_routing(step.routed_experts)
        # Reconcile: bytes the stream decoder still holds (an unfinished UTF-8 sequence)
        # appear in the full decoding as replacement characters.
        full = backend.decode(self._text_ids(held), skip_special_tokens=False)
        streamed = "".join(pieces)
        tail = full[len(streamed) :] if full.startswith(streamed) and len(full) > len(streamed) else ""
        if stops is not None:
            tail = stops.feed(tail) + stops.flush() if tail else stops.flush()
            self.stop_sequence = stops.matched
            self.text = stops.raw[: stops.emitted]
        else:
            self.text = streamed + tail
        evs = parser.feed(tail) if tail else []
        more, self.result = parser.finish()
        evs.extend(more)
        if evs:
            yield evs

    async def run_to_end(self) -> None:
        """Non-streaming: collect every token, then decode and parse once."""
        ids, lps = self.completion_ids, self.logprobs
        async for step in self._token_steps():
            if step.token_id is not None:
                if not ids:
                    self.t_first = time.time()
                ids.append(step.token_id)
                lps.append(step.logprob if step.logprob is not None else 0.0)
            if step.finish_reason is not None:
                self.finish_reason = step.finish_reason
                self.routed_experts = as_routing(step.routed_experts)
        held = ids[-1] if ids and ids[-1] in self.ctx.eos_ids else None
        text = self.ctx.backend.decode(self._text_ids(held), skip_special_tokens=False)
        if self.params.stop:
            f = StopFilter(self.params.stop)
            text = f.feed(text) + f.flush()
            self.stop_sequence = f.matched
        self.text = text
        self.result = parse_completion(text, self.ctx.tool_format, self.ctx.starts_in_reasoning)

    def _text_ids(self, held: int | None) -> list[int]:
        ids = self.completion_ids
        return ids[:-1] if held is not None and ids and ids[-1] == held else ids

    # -- after generation -------------------------------------------------------------
    def record(self, delivered: bool) -> Turn:
        """Record this call as a Turn; `delivered` False marks an aborted call (client
        gone, timeout, engine fault mid-stream), which never joins the trajectory."""
        if self.recorded:
            raise RuntimeError("turn recorded twice")
        self.recorded = True
        res = self.result or ParsedCompletion(self.text)
        # The oldest weights that sampled one of its tokens, where the engine says per token
        # (hf, vLLM's generate route): a request in flight across a weight sync finishes under
        # the new weights. Otherwise the engine's version when the turn ends.
        end_version = getattr(self.ctx.engine, "policy_version", 0)
        self.policy_version = self.oldest_version if self.oldest_version is not None else end_version
        finish = self.finish_reason if delivered else FinishReason.ABORT
        turn = Turn(
            session_id=self.session.id,
            index=self.index,
            dialect=self.dialect,
            prompt_ids=self.prompt_ids,
            completion_ids=self.completion_ids,
            logprobs=self.logprobs,
            finish_reason=finish,
            sampling_used=self.ctx.sampling_dict(self.params),
            sampling_requested=self.parsed.requested,
            request=self.body if self.ctx.cfg.record_request else {},
            response_text=self.text,
            tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments} for c in res.tool_calls],
            routed_experts=self.routed_experts,
            format_error=res.format_error,
            side_call=self.side_call,
            policy_version=self.policy_version,
            model=self.parsed.model,
            t_start=self.t_start,
            t_first_token=self.t_first,
            t_end=time.time(),
        )
        if delivered and not self.side_call and self.result is not None:
            self.session.state.remember(self.completion_ids, self.result, self.prompt_ids)
        self.ctx.sessions.add_turn(self.session, turn, delivered)
        return turn

    async def aclose(self) -> None:
        """Stop the engine stream (client gone or timeout), releasing its slot."""
        steps, self._steps = self._steps, None
        aclose = getattr(steps, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:  # noqa: BLE001 - the engine is being abandoned anyway
                pass

    # -- what every dialect reports -----------------------------------------------------
    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.completion_ids)


def _engine_error(e: BaseException) -> ProxyError:
    kind = type(e).__name__
    if isinstance(e, EngineError):
        return ProxyError(502, f"engine error: {e}", "engine")
    return ProxyError(502, f"engine error: {kind}: {e}", "engine")


__all__ = ["Parsed", "StopFilter", "TurnRun", "TextDelta"]
