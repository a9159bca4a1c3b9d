"""`scripted`: replays given completions, for tests, demos and the proxy benchmark.

Completions are given as text (tokenised once, with the model's tokenizer, and ended
with `<|im_end|>` unless `append_eos=False`) or as token ids. Which one a call gets:
- `cycle`: one counter for the whole engine, in order, wrapping around;
- `per_session`: the n-th completion for a prompt that already holds n assistant turns
  (occurrences of the `<|im_start|>assistant` ids, minus the generation prompt), so
  concurrent sessions each walk through the script from the start without the engine
  knowing session ids — and a harness that re-serialises or compacts its history still
  gets the turn its history says it is at.

Logprobs are fake but deterministic: a hash of (token id, position) mapped into
[-3, -0.003]. For MoE plumbing, `moe=(layers, top_k, experts)` adds equally fake,
deterministic routing for every prompt and completion token. Stop strings and
`max_tokens` truncate the scripted completion exactly as a real engine would stop; an
entry that runs to its end finishes with `stop` (with or without an eos id at its end).
Everything is precomputed per script entry, so a call costs a few list operations.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from legorl.engine.base import check_prompt, collect
from legorl.engine.sampling import validate_params
from legorl.types import FinishReason, Generation, SamplingParams, TokenStep, as_routing


def fake_logprob(token: int, position: int) -> float:
    return -(((token * 2654435761 + position * 40503) % 1000) + 1) * 0.003


def fake_routing(token: int, position: int, layers: int, top_k: int, experts: int) -> list[list[int]]:
    """k distinct experts per layer, a pure function of (token, position, layer)."""
    out = []
    for layer in range(layers):
        start = (token * 31 + position * 17 + layer * 7) % experts
        out.append([(start + j) % experts for j in range(top_k)])
    return out


class _Entry:
    """One scripted completion: its ids and where each token's text ends."""

    def __init__(self, ids: list[int], tokenizer: Any) -> None:
        self.ids = ids
        self.text = tokenizer.decode(ids, skip_special_tokens=False)
        self.ends = [len(tokenizer.decode(ids[: i + 1], skip_special_tokens=False)) for i in range(len(ids))]
        self._cut: dict[tuple[str, ...], int] = {}

    def cut_at_stop(self, stops: tuple[str, ...]) -> int | None:
        """Number of tokens up to and including the one that completes the first stop string."""
        if stops not in self._cut:
            hits = [i + len(s) for s in stops if (i := self.text.find(s)) >= 0]
            self._cut[stops] = next((t + 1 for t, end in enumerate(self.ends) if hits and end >= min(hits)), -1)
        cut = self._cut[stops]
        return None if cut < 0 else cut


class ScriptedEngine:
    """Replays a fixed list of completions; costs microseconds per call."""

    name = "scripted"
    Options: ClassVar[type | None] = None  # no `[engine] options`: every setting is an `[engine]` field

    def __init__(
        self,
        completions: Sequence[str | Sequence[int]],
        tokenizer: Any,
        *,
        mode: str = "cycle",
        append_eos: bool = True,
        moe: tuple[int, int, int] | None = None,
        latency_s: float = 0.0,
        max_context: int = 32768,
    ) -> None:
        if not completions:
            raise ValueError("scripted engine needs at least one completion (engine.scripted_completions)")
        if mode not in ("cycle", "per_session"):
            raise ValueError(f"scripted mode {mode!r}: expected 'cycle' or 'per_session'")
        if moe is not None and not (len(moe) == 3 and 1 <= moe[1] <= moe[2] and moe[0] >= 1):
            raise ValueError(f"scripted moe {moe!r}: expected (layers >= 1, top_k, experts >= top_k)")
        self.tokenizer = tokenizer
        self.mode = mode
        self.moe = moe
        self.latency_s = latency_s
        self.max_context = max_context
        self.policy_version = 0
        vocab = tokenizer.get_vocab()
        self.eos_id = vocab.get("<|im_end|>", tokenizer.eos_token_id)
        self.entries = []
        for c in completions:
            ids = tokenizer.encode(c, add_special_tokens=False) if isinstance(c, str) else [int(t) for t in c]
            if append_eos and isinstance(c, str) and (not ids or ids[-1] != self.eos_id):
                ids.append(self.eos_id)
            self.entries.append(_Entry(ids, tokenizer))
        self._marker = tokenizer.encode("<|im_start|>assistant", add_special_tokens=False)
        self._counter = itertools.count()
        self.calls = 0

    @classmethod
    def from_config(cls, cfg: Any, tokenizer: Any) -> ScriptedEngine:
        moe = tuple(cfg.scripted_moe) if cfg.scripted_moe else None
        return cls(
            cfg.scripted_completions,
            tokenizer,
            mode=cfg.scripted_mode,
            append_eos=cfg.scripted_append_eos,
            moe=moe,  # type: ignore[arg-type]
            latency_s=cfg.scripted_latency_s,
            max_context=cfg.max_context or 32768,
        )

    def turn_index(self, prompt_ids: list[int]) -> int:
        """Assistant turns already in the prompt (the trailing generation prompt excluded)."""
        m, n, count, start = self._marker, len(self._marker), 0, 0
        first = m[0]
        try:
            while True:
                i = prompt_ids.index(first, start)
                if prompt_ids[i : i + n] == m:
                    count += 1
                start = i + 1
        except ValueError:
            pass
        return max(count - 1, 0)

    def _pick(self, prompt_ids: list[int]) -> _Entry:
        i = self.turn_index(prompt_ids) if self.mode == "per_session" else next(self._counter)
        return self.entries[i % len(self.entries)]

    @property
    def records_routing(self) -> bool:
        return self.moe is not None

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        validate_params(params)
        check_prompt(prompt_ids, self.max_context)
        self.calls += 1
        entry = self._pick(prompt_ids)
        ids, finish = entry.ids, FinishReason.STOP
        cut = entry.cut_at_stop(params.stop) if params.stop else None
        if cut is not None:
            ids = ids[:cut]
        room = min(params.max_tokens, self.max_context - len(prompt_ids))
        if len(ids) > room:
            ids, finish = ids[:room], FinishReason.LENGTH
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        P = len(prompt_ids)
        for j, tok in enumerate(ids):
            yield TokenStep(tok, fake_logprob(tok, P + j))
        routing = None
        if self.moe is not None:
            layers, top_k, experts = self.moe
            routing = as_routing(
                [fake_routing(t, p, layers, top_k, experts) for p, t in enumerate(list(prompt_ids) + ids)]
            )
        yield TokenStep(None, None, finish, routing)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def update_weights(self, state_dict: Any, version: int) -> None:
        """Nothing to load: only the version moves (lets trainer-loop demos run on it)."""
        self.policy_version = int(version)

    async def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        self.policy_version = int(version)

    async def close(self) -> None:
        return None
