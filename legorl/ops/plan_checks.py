"""Pre-flight checks of the plan itself: the learning rate it will train at, and whether
each harness's first prompt fits the window.

Why: a learning rate of 0 (`lr = 0`, or a cosine schedule whose `total_steps` ends before
the run does) trains nothing and raises nothing; every metric still moves with sampling
noise. The schedule is read from the trainer's own rule (`Trainer._lr_factor`, the
`LambdaLR` factor it steps with) over every optimizer step the run plans (`run.steps` ×
`trainer.minibatches`), so this check and the trainer cannot disagree.

A harness whose native first prompt does not fit the policy's window turns every rollout
into a context refusal. `legorl train` refuses such a run at start-up
(`legorl.loop.window.check_windows`); the doctor calls the same function, so a config is
refused before anything is launched, with the same message. The probe's start cost against
the run's concurrency (`legorl.loop.harness_load`) makes the check a warning, as at start-up.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from legorl.loop.config import RunConfig
from legorl.monitor.doctor import CheckFailed, CheckResult, check, warn


def planned_lrs(cfg: RunConfig) -> list[float]:
    """The learning rate of every optimizer step the run plans, by the trainer's own rule."""
    from legorl.train.trainer import Trainer

    tc = cfg.trainer.resolved()
    factor = Trainer._lr_factor  # reads nothing but `self.cfg`: no model is loaded for this
    shim = SimpleNamespace(cfg=tc)
    return [tc.lr * factor(shim, k) for k in range(cfg.run.steps * tc.minibatches)]  # type: ignore[arg-type]


@check("learning rate non-zero", timeout=30)
def lr_check(cfg: RunConfig) -> str:
    """`learning rate non-zero`: fatal when any planned optimizer step has lr 0."""
    lrs = planned_lrs(cfg)
    if not lrs:
        raise CheckFailed("the run plans no optimizer step ([run] steps = 0)", fix="set [run] steps > 0")
    zero = [k for k, lr in enumerate(lrs) if not lr > 0.0]
    tc = cfg.trainer
    if zero:
        why = (
            "[trainer] lr = 0"
            if not tc.lr > 0
            else f"the {tc.schedule} schedule reaches 0 at total_steps = {tc.total_steps}"
        )
        raise CheckFailed(
            f"the learning rate is 0 on {len(zero)} of {len(lrs)} planned optimizer steps "
            f"(from step {zero[0]}): {why}; those steps train nothing",
            fix=f"set [trainer] lr > 0 and total_steps ≥ run.steps × minibatches ({cfg.run.steps * tc.minibatches})",
        )
    return f"lr {min(lrs):.3g}..{max(lrs):.3g} over {len(lrs)} optimizer steps ({tc.schedule})"


@check("first prompt fits the window", needs=("sandbox starts", "harness installed"), timeout=600)
def window_check(cfg: RunConfig) -> str | CheckResult:
    """`first prompt fits the window`: each harness plays one task against a probe engine
    (`check_windows`, as `legorl train` does at start-up)."""
    from legorl.engine.registry import make_engine
    from legorl.loop.errors import RunError
    from legorl.loop.harness_load import overloads
    from legorl.loop.startup import load_task_split
    from legorl.loop.window import FirstPrompt, check_windows
    from legorl.models import load_tokenizer

    names = [n for n in cfg.harness.names() if n != "command"]
    if not names:
        return "command harness only: the script's prompts are its own"
    tok = load_tokenizer(cfg.engine.model)
    task = load_task_split(cfg, cfg.run.split)[0]

    async def go() -> tuple[int, dict[str, FirstPrompt]]:
        engine = make_engine(cfg.engine, tok)
        try:  # the window `legorl train` uses (loop/train.py)
            window = min(cfg.proxy.max_context, int(getattr(engine, "max_context", 0) or cfg.proxy.max_context))
            return window, await check_windows(cfg, tok, task, window)
        finally:
            await engine.close()

    try:
        window, firsts = asyncio.run(go())
    except RunError as e:
        raise CheckFailed(
            str(e).removeprefix("pre-flight: "),
            fix="raise [proxy] max_context (within the model's window), lower [proxy] max_tokens, "
            "or serve a policy with a longer window",
        ) from None
    said = ", ".join(f"{n} {fp.tokens}" for n, fp in firsts.items())
    loads = overloads(cfg, firsts)
    fits = f"first prompts (tokens): {said}; + max_tokens {cfg.proxy.max_tokens} ≤ window {window}"
    if loads:  # fits, but this machine may time the rollouts out (loop/harness_load.py)
        fix = f"run.max_concurrent_rollouts ≤ {min(ld.safe_concurrency for ld in loads)}"
        return warn(fits + "; " + "; ".join(ld.message() for ld in loads), fix=fix)
    return fits
