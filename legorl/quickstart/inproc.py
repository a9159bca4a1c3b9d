"""Many quickstart episodes at once, in one process, with the harness's own messages.

Each episode is a `Dialogue` (mini-swe-agent's text-based loop, from the same YAML the
real harness loads) plus a `Workspace` where its commands run. Every round, the episodes
that want a model call are rendered to ids by the proxy's `Renderer` (splicing the ids
the policy sampled earlier, exactly as the proxy does, so an episode stays one segment),
sampled together in one batch, and recorded as `Turn`s — the same records the proxy makes,
so SFT, GSPO and the run store treat both paths alike. Replies can instead come from a
`reply_fn` (the scripted expert), tokenised the way the scripted engine returns them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from legorl.proxy.render import ChatRequest, Renderer, RenderState
from legorl.proxy.toolcalls import parse_completion
from legorl.quickstart.dialogue import Dialogue
from legorl.quickstart.lockstep import sample_batch
from legorl.quickstart.workspace import Workspace, outcome_of
from legorl.types import Dialect, FinishReason, Outcome, Turn


@dataclass
class Episode:
    task_id: str
    dialogue: Dialogue
    workspace: Workspace
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    turns: list[Turn] = field(default_factory=list)
    render_state: RenderState = field(default_factory=RenderState)
    outcome: Outcome | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def resolved(self) -> bool:
        return self.outcome is not None and self.outcome.reward > 0


# (episode, last observation) -> the reply as text (tokenised as the scripted engine does)
# or as token ids (replaying what an engine returned)
ReplyFn = Callable[[Episode, str | None], "str | list[int]"]


def run_episodes(
    episodes: list[Episode],
    renderer: Renderer,
    *,
    model: torch.nn.Module | None = None,
    reply_fn: ReplyFn | None = None,
    temperature: float = 1.0,
    max_tokens: int = 48,
    generator: torch.Generator | None = None,
    policy_version: int = 0,
    workers: int = 8,
    max_context: int = 2048,
) -> list[Episode]:
    """Play every episode to its end (policy `model`, or `reply_fn`), then grade each;
    `workers` commands (and gradings) run at a time. Like the proxy, a prompt of
    `max_context` tokens or more ends its episode, and a completion gets at most
    `min(max_tokens, max_context - prompt)` tokens."""
    if (model is None) == (reply_fn is None):
        raise ValueError("run_episodes needs exactly one of model= and reply_fn=")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return _play(episodes, renderer, model, reply_fn, temperature, max_tokens, max_context, gen,
                     policy_version, pool)  # fmt: skip


def _play(
    episodes: list[Episode], renderer: Renderer, model: torch.nn.Module | None, reply_fn: ReplyFn | None,
    temperature: float, max_tokens: int, max_context: int, gen: torch.Generator, policy_version: int,
    pool: ThreadPoolExecutor,
) -> list[Episode]:
    last_obs: dict[str, str | None] = {e.session_id: None for e in episodes}
    while True:
        live, prompts = [], []
        for e in episodes:
            if not e.dialogue.wants_query():
                continue
            prompt = renderer.render(ChatRequest(list(e.dialogue.messages)), e.render_state)
            if len(prompt) >= max_context:  # as the proxy refuses it
                e.dialogue.out_of_context()
                continue
            live.append(e)
            prompts.append(prompt)
        if not live:
            break
        room = [min(max_tokens, max_context - len(p)) for p in prompts]
        t0 = time.time()
        if model is not None:
            outs = sample_batch(
                model, prompts, temperature=temperature, max_tokens=room,
                eos_ids=frozenset(renderer.eos_ids), generator=gen,
            )  # fmt: skip
            completions = [(o.completion_ids, o.logprobs, o.finish_reason) for o in outs]
        else:
            completions = []
            for e in live:
                reply = reply_fn(e, last_obs[e.session_id])
                ids = renderer.encode(reply) + [renderer.im_end] if isinstance(reply, str) else list(reply)
                completions.append((ids, [0.0] * len(ids), FinishReason.STOP))
        t1 = time.time()
        commands: list[tuple[Episode, str]] = []
        for e, prompt, (ids, lps, finish) in zip(live, prompts, completions):
            text = renderer.decode(ids[:-1] if ids and ids[-1] in renderer.eos_ids else ids)
            parsed = parse_completion(text)
            e.render_state.remember(ids, parsed)
            turn = Turn(
                session_id=e.session_id, index=len(e.turns), dialect=Dialect.OPENAI_CHAT,
                prompt_ids=prompt, completion_ids=ids, logprobs=lps, finish_reason=finish,
                sampling_used={"temperature": temperature, "max_tokens": max_tokens},
                response_text=text, policy_version=policy_version, t_start=t0, t_end=t1,
            )  # fmt: skip
            e.turns.append(turn)
            command = e.dialogue.on_reply(text, str(finish))
            if command is not None:
                commands.append((e, command))
        # commands run concurrently: each is a subprocess, and waiting for it frees the GIL
        for (e, _), output in zip(commands, pool.map(lambda ec: ec[0].workspace.execute(ec[1]), commands)):
            e.dialogue.on_output(output)
            last_obs[e.session_id] = output.get("output", "")
    outcomes = pool.map(lambda e: outcome_of(e.dialogue.exit_status, e.workspace), episodes)
    for e, outcome in zip(episodes, outcomes):
        e.outcome = outcome
        e.info["exit_status"] = e.dialogue.exit_status
        e.workspace.close()
    return episodes
