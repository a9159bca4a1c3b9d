"""`run_quickstart`: SFT warm start, then GSPO, on a tiny model, in minutes on a CPU.

Phases (each timed; every number below lands in `quickstart_results.json` and the run store):

1. **Expert data.** The real mini-swe-agent runs `expert_episodes` training tasks through
   the proxy against the scripted expert (`ExpertEngine`); the proxy's recorded turns,
   assembled into trajectories, are the SFT data — token-exact.
2. **Evaluate "start"** — the untrained model on `heldout_episodes` held-out tasks.
3. **SFT** on every demonstration.
4. **Evaluate "after SFT"** — the checkpoint GSPO starts from.
5. **GSPO** for `rl_steps` steps (`rl.py`).
6. **Evaluate "after GSPO"**, and the gain over the SFT checkpoint with its 95% interval.

Each evaluation plays all `heldout_episodes` tasks in process (mini-swe-agent's messages
rendered by the proxy's renderer, commands run for real, graded by a fresh test run), and
the first `harness_eval_episodes` of them again through the real harness and the proxy,
with the `hf` engine serving the same weights; a replay check confirms that both paths put
identical prompt ids before the policy.
"""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from legorl.config import ConfigError
from legorl.models import load_tokenizer, resolve_model
from legorl.proxy.render import Renderer
from legorl.quickstart import family
from legorl.quickstart.config import QuickstartConfig, load_quickstart
from legorl.quickstart.dialogue import Dialogue, load_agent_config
from legorl.quickstart.evaluate import Evaluation, newcombe_diff, table
from legorl.quickstart.expert import expert_draw, expert_reply
from legorl.quickstart.inproc import Episode, run_episodes
from legorl.quickstart.recording import RESULTS_FILE, Recorder
from legorl.quickstart.rl import (
    SAMPLE_ATTN,
    TRAIN_ATTN,
    make_trainer,
    rl_step,
    set_attention,
    task_stream,
    trajectory_of,
)
from legorl.quickstart.sft import SFTConfig, sft
from legorl.quickstart.workspace import DirWorkspace, command_env, fast_python_dir
from legorl.train import varlen
from legorl.train.logprobs import PolicyModel

MAX_CONTEXT = 2048  # tokens: the model's positions; the proxy and the in-process path both enforce it


def run_quickstart(config_path: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """Run the whole quickstart; writes `out_dir/quickstart_results.json` and the run store
    (`out_dir` defaults to the config's `run_dir`)."""
    cfg = load_quickstart(Path(config_path))
    return run_with_config(cfg, Path(out_dir) if out_dir is not None else cfg.run_dir)


def run_with_config(cfg: QuickstartConfig, out_dir: Path) -> dict[str, Any]:
    torch.set_num_threads(1)  # one thread per process: 3–4× faster than two on a busy machine
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = cfg.model_copy(update={"run_dir": out_dir.resolve()})  # what the run store records
    return asyncio.run(_run(cfg, out_dir))


class _Clock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.phases: dict[str, float] = {}

    def phase(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - since, 2)
        return now


async def _run(cfg: QuickstartConfig, out_dir: Path) -> dict[str, Any]:
    clock = _Clock()
    work = out_dir / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rec = Recorder(out_dir, cfg, load_tokenizer(cfg.model))
    harness = None
    try:
        if cfg.harness != "none":
            harness = _Harness(cfg, Renderer(rec.tok), work, command_env(fast_python_dir(work)), rec)
            await harness.start()
        results = await _phases(cfg, out_dir, work, rec, harness, clock)
    finally:
        if harness is not None:
            await harness.stop()
        shutil.rmtree(work, ignore_errors=True)
        rec.close()
    return results


async def _phases(
    cfg: QuickstartConfig, out_dir: Path, work: Path, rec: Recorder, harness: _Harness | None, clock: _Clock
) -> dict[str, Any]:
    t = clock.t0
    env = command_env(fast_python_dir(work))
    agent_cfg = load_agent_config()
    renderer = Renderer(rec.tok)
    lm = transformers.AutoModelForCausalLM.from_pretrained(resolve_model(cfg.model), dtype=torch.float32)
    set_attention(lm, SAMPLE_ATTN)
    lm.eval()
    if harness is not None:
        harness.lm = lm
    k = cfg.functions_per_task
    train_tasks = family.tasks("train", cfg.expert_episodes + cfg.rl_steps * cfg.rl_tasks_per_step, k)
    heldout = family.tasks("heldout", cfg.heldout_episodes, k)
    gen = torch.Generator().manual_seed(cfg.seed)
    t = clock.phase("setup", t)

    def episode_of(task: family.QuickTask) -> Episode:
        return Episode(task.instance_id, Dialogue(agent_cfg, family.PROBLEM), DirWorkspace(task, work, env),
                       info={"task": task})  # fmt: skip

    async def evaluate(label: str, step: int, with_harness: bool = True) -> dict[str, Evaluation]:
        t_eval = time.perf_counter()
        lm.eval()
        eps = run_episodes([episode_of(x) for x in heldout], renderer, model=lm, temperature=cfg.temperature,
                           max_tokens=cfg.max_tokens, generator=gen)  # fmt: skip
        rows = {"in-process": rec.evaluation(label, eps, time.perf_counter() - t_eval, step)}
        if harness is not None and cfg.harness_eval_episodes and with_harness:
            t_h, n = time.perf_counter(), cfg.harness_eval_episodes
            same = sum(e.resolved for e in eps[:n])
            rows["harness"] = await harness.evaluate(label, heldout[:n], step, t_h, same)
        return rows

    # 1. expert data: every demonstration, right or wrong (an infrastructure fault is dropped)
    demo_tasks = train_tasks[: cfg.expert_episodes]
    if harness is not None:
        demos = await harness.expert(demo_tasks)
    else:
        eps = run_episodes([episode_of(x) for x in demo_tasks], renderer,
                           reply_fn=lambda e, obs: expert_reply(obs, expert_draw(cfg.seed, obs), cfg.p_read))  # fmt: skip
        demos = [trajectory_of(e, 0) for e in eps]
        rec.demos(demos, "in-process", [e.turns for e in eps])
    demos = [d for d in demos if d.segments and d.outcome is not None and not d.outcome.masked]
    t = clock.phase("expert_data", t)

    # 2-4. start, SFT, after SFT
    evals: dict[str, dict[str, Evaluation]] = {"start": await evaluate("start", 0)}
    t = clock.phase("eval_start", t)
    varlen.register()
    set_attention(lm, TRAIN_ATTN)
    policy = PolicyModel(lm)
    sft_cfg = SFTConfig(steps=cfg.sft_steps, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr, seed=cfg.seed)
    optimizer = sft(policy, demos, sft_cfg, log=rec.sft_metrics)
    set_attention(lm, SAMPLE_ATTN)
    sft_state = {k: v.detach().clone() for k, v in lm.state_dict().items()} if cfg.control_sft_steps else None
    sft_opt_state = copy.deepcopy(optimizer.state_dict()) if cfg.control_sft_steps else None
    t = clock.phase("sft", t)
    evals["after_sft"] = await evaluate("after SFT", 1)
    t = clock.phase("eval_after_sft", t)

    # 5. GSPO
    trainer = make_trainer(lm, cfg.rl_lr, optimizer.state_dict() if cfg.sft_steps else None, cfg.seed)
    take = task_stream(train_tasks[cfg.expert_episodes :], cfg.seed)
    for step in range(cfg.rl_steps):
        episodes, trajs, metrics = rl_step(
            trainer, take(cfg.rl_tasks_per_step), cfg.rl_group_size, episode_of, renderer,
            temperature=cfg.temperature, max_tokens=cfg.max_tokens, generator=gen, step=step + 2,
        )  # fmt: skip
        rec.rl_step(step + 2, episodes, trajs, metrics, cfg.rl_group_size)
    t = clock.phase("gspo", t)

    # 6. after GSPO, and the table
    evals["after_gspo"] = await evaluate("after GSPO", cfg.rl_steps + 2)
    t = clock.phase("eval_after_gspo", t)

    # 7. control: the same SFT checkpoint, more SFT instead of GSPO
    if sft_state is not None:
        lm.load_state_dict(sft_state)
        set_attention(lm, TRAIN_ATTN)
        tail_lr = cfg.sft_lr * sft_cfg.min_lr_ratio
        more = SFTConfig(steps=cfg.control_sft_steps, batch_size=cfg.sft_batch_size, lr=tail_lr, warmup_steps=0,
                         min_lr_ratio=1.0, seed=cfg.seed + 1)  # fmt: skip
        sft(PolicyModel(lm), demos, more, optimizer_state=sft_opt_state)
        set_attention(lm, SAMPLE_ATTN)
        t = clock.phase("control_sft", t)
        evals["control_more_sft"] = await evaluate("SFT continued", cfg.rl_steps + 3, with_harness=False)
        clock.phase("eval_control", t)
    return rec.finish(cfg, evals, clock.phases, time.perf_counter() - clock.t0)


class _Harness:
    """The real-harness side of a run: proxy + mini-swe-agent worker + hf engine."""

    def __init__(self, cfg: QuickstartConfig, renderer: Renderer, work: Path, env: dict[str, str],
                 rec: Recorder) -> None:  # fmt: skip
        self.cfg, self.renderer, self.work, self.env, self.rec = cfg, renderer, work, env, rec
        self.lm: torch.nn.Module | None = None  # the policy, set once loaded
        self.runner: Any = None
        self.engine: Any = None
        self.expert_engine: Any = None

    async def start(self) -> None:
        from legorl.engine.hf import HFEngine
        from legorl.proxy.config import ProxyConfig
        from legorl.quickstart.expert import ExpertEngine
        from legorl.quickstart.harness_run import (
            HarnessRunner,
            HarnessUnavailable,
            mini_python,
        )

        try:
            mini_python()
        except HarnessUnavailable as e:
            raise ConfigError(f"[quickstart] harness = 'mini-swe-agent', but {e} "
                              "(or set harness = 'none' to run in process only)") from None  # fmt: skip

        tok = self.renderer.tokenizer
        self.expert_engine = ExpertEngine(tok, self.cfg.p_read, seed=self.cfg.seed)
        self.engine = HFEngine(self.cfg.model, tok, max_batch_size=128, seed=self.cfg.seed, record_routing=False)
        proxy_cfg = ProxyConfig(temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens,
                                max_context=MAX_CONTEXT, request_timeout_s=300)  # fmt: skip
        self.runner = HarnessRunner(self.renderer, self.expert_engine, self.work, self.env,
                                    proxy_cfg=proxy_cfg, threads=self.cfg.harness_threads)  # fmt: skip
        await self.runner.__aenter__()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.__aexit__(None, None, None)
        if self.engine is not None:
            await self.engine.close()

    async def expert(self, tasks: list[family.QuickTask]) -> list[Any]:
        eps = await self.runner.run(tasks, self.expert_engine, step=0)
        trajs = [self.rec.harness_trajectory(e, 0, "expert") for e in eps]
        self.rec.demos(trajs, "mini-swe-agent")
        return trajs

    async def evaluate(
        self, label: str, tasks: list[family.QuickTask], step: int, t0: float, same_tasks_in_process: int
    ) -> Evaluation:
        assert self.lm is not None
        state = {k: v.detach().clone() for k, v in self.lm.state_dict().items()}
        await self.engine.update_weights(state, step)
        eps = await self.runner.run(tasks, self.engine, step=step)
        trajs = [self.rec.harness_trajectory(e, step, label) for e in eps]
        parity = replay_parity(eps, self.renderer, self.work, self.env)
        return self.rec.harness_evaluation(label, eps, trajs, time.perf_counter() - t0, step, parity,
                                           same_tasks_in_process)  # fmt: skip


def replay_parity(
    eps: list[Any], renderer: Renderer, work: Path, env: dict[str, str], max_context: int = MAX_CONTEXT
) -> dict[str, int]:
    """Replay each harness episode in process with the completions the engine returned
    (same ids, commands re-run in fresh directories) and count the turns whose prompt ids
    equal what the proxy recorded from the real harness."""
    agent_cfg = load_agent_config()
    replays, recorded = [], {}
    for he in eps:
        ep = Episode(he.task.instance_id, Dialogue(agent_cfg, family.PROBLEM), DirWorkspace(he.task, work, env))
        recorded[ep.session_id] = [t for t in he.turns if not t.side_call]
        replays.append(ep)

    def reply(ep: Episode, _obs: str | None) -> list[int]:
        turns = recorded[ep.session_id]
        i = len(ep.turns)
        return list(turns[i].completion_ids) if i < len(turns) else [renderer.im_end]

    run_episodes(replays, renderer, reply_fn=reply, max_context=max_context)
    compared = equal = 0
    for ep in replays:
        for mine, theirs in zip(ep.turns, recorded[ep.session_id]):
            compared += 1
            equal += mine.prompt_ids == theirs.prompt_ids
        compared += abs(len(ep.turns) - len(recorded[ep.session_id]))
    return {"turns_compared": compared, "turns_identical": equal}


def results_json(out_dir: Path) -> dict[str, Any]:
    return json.loads((out_dir / RESULTS_FILE).read_text())


__all__ = ["RESULTS_FILE", "newcombe_diff", "results_json", "run_quickstart", "run_with_config", "table"]
