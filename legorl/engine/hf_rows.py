"""Per-request state of the `hf` engine: the request as submitted, and its running row.

Kept apart from the scheduling loop in `hf.py` so the loop reads as "admit, prefill,
decode, finish"; everything about one request (its stop conditions, its stream back to
the asyncio caller, its recorded routing) lives here.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import torch

from legorl.engine.kv_prefix import id_array
from legorl.types import FinishReason, Routing, SamplingParams, TokenStep, as_routing


def eos_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    """Ids that end a completion: the tokenizer's eos, `<|im_end|>`, `<|endoftext|>`, and the
    model config's / generation config's eos ids."""
    ids: set[int] = set()

    def add(value: Any) -> None:
        if isinstance(value, int) and value >= 0:
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                add(v)

    add(getattr(tokenizer, "eos_token_id", None))
    vocab = tokenizer.get_vocab()
    for tok in ("<|im_end|>", "<|endoftext|>"):
        add(vocab.get(tok))
    add(getattr(model.config, "eos_token_id", None))
    add(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    return frozenset(ids)


class Outbox:
    """Steps produced by the generation thread, handed to each caller's event loop in one
    wake-up per loop per engine iteration (not one per token: each wake-up is a syscall)."""

    def __init__(self) -> None:
        self._items: list[tuple[Request, TokenStep | BaseException]] = []

    def put(self, req: Request, item: TokenStep | BaseException) -> None:
        self._items.append((req, item))

    def flush(self) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Request, TokenStep | BaseException]]] = {}
        for req, item in self._items:
            by_loop.setdefault(req.loop, []).append((req, item))
        self._items = []
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the caller's loop is closed: nobody is listening
                for req, _ in items:
                    req.cancelled = True


def _deliver(items: list[tuple[Request, TokenStep | BaseException]]) -> None:
    for req, item in items:
        req.queue.put_nowait(item)


class Request:
    """A submitted request and its channel back to the caller's event loop."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        loop: asyncio.AbstractEventLoop,
        outbox: Outbox,
        tokenizer: Any,
        device: torch.device,
        prompt_N: np.ndarray | None = None,
    ) -> None:
        self.prompt_ids = prompt_ids
        self.prompt_N = id_array(prompt_ids if prompt_N is None else prompt_N)  # what prefix matching compares
        self.params = params
        self.loop = loop
        self.outbox = outbox
        self.tokenizer = tokenizer
        self.queue: asyncio.Queue[TokenStep | BaseException] = asyncio.Queue()
        self.cancelled = False  # set by the caller going away, or by the engine once done
        self.generator: torch.Generator | None = None
        if params.seed is not None and params.temperature > 0:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(int(params.seed) % 2**63)

    def emit(self, item: TokenStep | BaseException) -> None:
        self.outbox.put(self, item)

    def fail(self, exc: BaseException) -> None:
        self.emit(exc)
        self.cancelled = True


class Row:
    """A running request: its tokens so far, stop bookkeeping, and recorded routing."""

    def __init__(self, req: Request, version: int = 0) -> None:
        self.req = req
        self.version = version  # the weights that prefilled it (a later update leaves its columns mixed)
        self.tokens = list(req.prompt_ids)
        self.completion: list[int] = []
        self.finish: FinishReason | None = None
        self.done = False
        self.stored = False  # its columns went to the prefix store (once, the step it finished)
        self.routing: list[torch.Tensor] = []  # chunks of (T, L, K)
        longest = max((len(s) for s in req.params.stop), default=0)
        self._stop_window = 4 * longest + 8  # tokens; a token is >= 1/4 character

    def add(self, token: int, logprob: float, eos: frozenset[int], max_context: int, version: int) -> None:
        """Record a sampled token (by the weights of policy `version`), stream it, and decide
        whether the request is finished."""
        self.tokens.append(token)
        self.completion.append(token)
        self.req.emit(TokenStep(token, logprob, policy_version=version))
        if token in eos or self._hit_stop_string():
            self.finish = FinishReason.STOP
        elif len(self.completion) >= self.req.params.max_tokens or len(self.tokens) >= max_context:
            self.finish = FinishReason.LENGTH

    def _hit_stop_string(self) -> bool:
        if not self.req.params.stop:
            return False
        tail = self.req.tokenizer.decode(self.completion[-self._stop_window :], skip_special_tokens=False)
        return any(s in tail for s in self.req.params.stop)

    def routed_all(self) -> bool:
        return sum(int(c.shape[0]) for c in self.routing) == len(self.tokens)

    def routed_experts(self) -> Routing:
        return as_routing(torch.cat(self.routing, dim=0).numpy())
