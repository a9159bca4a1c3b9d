"""The Engine protocol: generate by token ids, report what was sampled.

Every engine (in-process `hf`, HTTP `vllm`/`sglang`, `scripted`, `oracle`) takes prompt
token ids and returns completion token ids with the log-probability of each sampled token
and, for MoE models, the experts every token was routed to. The proxy never sends text to
an engine: rendering and tokenising are the proxy's job, so the recorded ids are exactly
the ids the policy conditioned on and produced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from legorl.types import FinishReason, Generation, SamplingParams, TokenStep


class EngineError(RuntimeError):
    """The engine failed (server down, bad response): an infrastructure fault."""


class ContextLengthExceeded(ValueError):
    """The prompt leaves no room for a completion in the model's context: the agent's fault
    (its context grew too long), not an infrastructure fault. Engines expose `max_context`."""


@runtime_checkable
class Engine(Protocol):
    """Token-in/token-out generation."""

    name: str
    policy_version: int  # bumped by every weight sync
    max_context: int  # prompt + completion tokens the model takes (2**31 where unbounded)

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        """Yield one TokenStep per sampled token, then a final step with `finish_reason` set
        (and `routed_experts` for MoE engines). Must stop on any of `params.stop` strings
        (decoded) and on the tokenizer's end-of-turn/eos ids."""
        ...

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation: ...

    async def close(self) -> None: ...


# Optional capabilities: small protocols an engine has or lacks, checked with isinstance
# where the engine is used for something that needs them (weight sync, the engine server,
# the Ray pool): never probed with getattr.


@runtime_checkable
class HoldsTokenizer(Protocol):
    """An engine that holds the tokenizer it samples with (in-process engines); the proxy
    and the engine server render with that very object instead of loading another."""

    tokenizer: Any


@runtime_checkable
class WeightsInPlace(Protocol):
    """Takes new weights as a state dict in this process, between two generation steps."""

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None: ...


@runtime_checkable
class WeightsFromDisk(Protocol):
    """Reloads weights from an HF model directory it can read (HTTP servers, the hf engine
    behind the engine server)."""

    async def update_weights_from_disk(self, path: str | Path, version: int) -> None: ...


@runtime_checkable
class ServesModelDir(Protocol):
    """A server that can reload only the directory it was launched on (vLLM) names it here;
    weight sync then rewrites that directory in place."""

    served_model_dir: str | Path | None


@runtime_checkable
class RecordsRouting(Protocol):
    """Can return, per sampled token, the experts a MoE model routed it to."""

    records_routing: bool  # False for a dense model or when the config did not ask


@runtime_checkable
class CountsPrefill(Protocol):
    """An in-process engine that counts the prompt tokens it was given and those it copied from
    stored prefixes instead of computing (`hf`): an agent's turns re-send their transcript, so
    the share reused is most of what a turn costs the engine."""

    stats: dict[str, int]


def prefill_share(engine: Engine | None) -> dict[str, float] | None:
    """Prompt tokens given, reused and the share reused; None for an engine that does not count."""
    if not isinstance(engine, CountsPrefill):
        return None
    given, reused = engine.stats.get("prompt_tokens", 0), engine.stats.get("reused_tokens", 0)
    return {"prompt_tokens": given, "reused_tokens": reused, "reused_share": round(reused / given, 4) if given else 0.0}


def records_routing(engine: Engine) -> bool:
    return isinstance(engine, RecordsRouting) and engine.records_routing


def check_prompt(prompt_ids: list[int], max_context: int) -> None:
    """Refuse a prompt before it reaches the model: an empty one is the caller's bug
    (ValueError), one that fills the context is the agent's doing (ContextLengthExceeded,
    which the rollout grades instead of retrying)."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: the engine needs at least one prompt token")
    if len(prompt_ids) >= max_context:
        raise ContextLengthExceeded(
            f"prompt of {len(prompt_ids)} tokens leaves no room in the model's context of {max_context} tokens"
        )


async def collect(steps: AsyncIterator[TokenStep], prompt_tokens: int) -> Generation:
    """Drain a stream into a Generation (the default `generate` of streaming engines)."""
    ids: list[int] = []
    lps: list[float] = []
    finish = FinishReason.ABORT
    routing = None
    async for step in steps:
        if step.token_id is not None:
            ids.append(step.token_id)
            lps.append(float(step.logprob if step.logprob is not None else 0.0))
        if step.finish_reason is not None:
            finish = step.finish_reason
            routing = step.routed_experts
    return Generation(ids, lps, finish, routing, prompt_tokens)
