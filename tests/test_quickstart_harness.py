"""The quickstart's real-harness path: mini-swe-agent → HTTP → proxy → engine, token-exact.

Real components only: the mini-swe-agent layer's interpreter runs the worker
(`legorl/quickstart/mini_worker.py`: mini-swe-agent's DefaultAgent + LiteLLM), the proxy is
a real uvicorn server on loopback, commands run with sh in real directories, grading runs
the task's tests in a fresh directory. Checked: each expert episode is one segment whose
ids are exactly what the proxy rendered and the engine returned (so SFT trains on the
recorded tokens), the expert's choices decide the grades, and the in-process path
renders the same prompt ids for the same episodes (replay parity), also after the
policy's format errors (an untrained model through the `hf` engine).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import transformers  # noqa: F401  (before any event loop: its hub import runs asyncio)

from legorl.harness.install import is_built
from legorl.models import load_tokenizer
from legorl.proxy.config import ProxyConfig
from legorl.proxy.render import Renderer
from legorl.quickstart import family
from legorl.quickstart.expert import ExpertEngine
from legorl.quickstart.harness_run import HarnessRunner
from legorl.quickstart.recording import choice_of
from legorl.quickstart.run import replay_parity
from legorl.quickstart.workspace import command_env, fast_python_dir
from legorl.trajectory import assemble
from legorl.types import Status

pytestmark = [pytest.mark.harness, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _need_layer() -> None:
    if not is_built("mini-swe-agent"):  # CI builds it; a missing layer is a broken set-up, not a skip
        pytest.fail("harness layer mini-swe-agent not built: run scripts/setup_harnesses.sh")


async def test_expert_and_policy_episodes_through_the_real_harness(tmp_path: Path) -> None:
    from legorl.engine.hf import HFEngine

    tok = load_tokenizer("quickstart-qwen3")
    renderer = Renderer(tok)
    env = command_env(fast_python_dir(tmp_path))
    expert = ExpertEngine(tok, p_read=0.5, seed=3)
    tasks = family.tasks("train", 12, k=3)
    proxy_cfg = ProxyConfig(max_tokens=48, max_context=2048)
    async with HarnessRunner(renderer, expert, tmp_path, env, proxy_cfg=proxy_cfg, threads=6) as runner:
        eps = await runner.run(tasks, step=0)
        assert [e.exit_status for e in eps] == ["Submitted"] * len(tasks), [e.error for e in eps]
        for e in eps:
            assert len(e.turns) == 2
            traj = assemble(e.turns)
            assert traj.stats.segments == 1  # the harness replays the policy's messages verbatim
            seg = traj.segments[0]
            assert seg.token_ids[: len(e.turns[1].prompt_ids)] == e.turns[1].prompt_ids
            assert tok.decode(e.turns[1].completion_ids[:-1]) == e.turns[1].response_text
            assert e.resolved == (choice_of(e.task, e.turns) == "failing"), (e.task, e.turns[1].response_text)
            assert e.outcome.tests[f"test_{e.task.buggy}"] == ("passed" if e.resolved else "failed")
        parity = replay_parity(eps, renderer, tmp_path, env)
        assert parity == {"turns_compared": 2 * len(tasks), "turns_identical": 2 * len(tasks)}

        # an untrained policy: random text, format errors, the harness gives up after two
        engine = HFEngine("quickstart-qwen3", tok, max_batch_size=16, seed=0, record_routing=False)
        try:
            bad = await asyncio.wait_for(runner.run(tasks[:4], engine, step=1), 300)
        finally:
            await engine.close()
        assert all(e.exit_status == "RepeatedFormatError" for e in bad), [e.exit_status for e in bad]
        assert all(e.outcome.status == Status.FORMAT_ERROR and not e.outcome.masked for e in bad)
        assert all(t.logprobs and all(lp <= 0 for lp in t.logprobs) for e in bad for t in e.turns)
        parity = replay_parity(bad, renderer, tmp_path, env)
        assert parity["turns_identical"] == parity["turns_compared"] == sum(len(e.turns) for e in bad)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("calc-")) == []


async def test_failing_commands_and_context_overflow_match_the_in_process_path(tmp_path: Path) -> None:
    """A NUL byte in a command (the tokenizer can sample one) and a conversation that outgrows
    the context end the same way, with the same prompt ids, in both paths."""
    from legorl.engine.scripted import ScriptedEngine

    tok = load_tokenizer("quickstart-qwen3")
    renderer = Renderer(tok)
    env = command_env(fast_python_dir(tmp_path))
    replies = ["```mswea_bash_command\necho a\x00b\n```", "```mswea_bash_command\nseq 1 400\n```"]
    engine = ScriptedEngine(replies, tok, mode="per_session")
    cfg = ProxyConfig(max_tokens=48, max_context=512)
    async with HarnessRunner(renderer, engine, tmp_path, env, proxy_cfg=cfg, threads=2) as runner:
        eps = await runner.run(family.tasks("train", 2, k=3), step=0)
    for e in eps:
        assert e.exit_status == "ContextWindowExceededError", e.error
        assert e.outcome.status == Status.FAILED and not e.outcome.masked  # graded, the agent's doing
        assert [t.response_text for t in e.turns] == replies
    obs = tok.decode(eps[0].turns[1].prompt_ids)
    assert "<exception>An error occurred while executing the command: embedded null byte</exception>" in obs
    parity = replay_parity(eps, renderer, tmp_path, env, max_context=512)
    assert parity == {"turns_compared": 4, "turns_identical": 4}
