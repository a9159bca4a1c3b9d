"""Pre-flight: routing replay is wired, for an MoE policy (one dry step).

Why: with routing replay miswired (replay off, or the engine's recorded experts not the
trainer's: another layer order, ids off by one, routing not recorded at all), the trainer
recomputes every token's probability through other experts than those that sampled it. No
error is raised; the rollout/trainer Pearson correlation sits near 0.75 and GSPO optimises
something the engine never sampled. So before the run, the configured engine samples one
completion with its routing recorded, the trainer's own model recomputes it through the
trainer's own path (`PolicyModel` with the trainer's `LogprobOptions`, i.e. replaying the
recording when `trainer.routing_replay` is on), and the correlation is measured with the
trainer's own statistic (`legorl.train.mismatch`). Below `PEARSON_MIN` is fatal, naming
replay. So is a recording the trainer's router disagrees with on more than
`NATURAL_DISAGREEMENT_MAX` of (token, layer) pairs: numerics move a few experts, a miswired
recording (layers shifted, ids offset) moves nearly all, and on a small or untrained model
whose probabilities are near uniform that shows before the correlation does. A dense model
has nothing to replay and passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from legorl.loop.config import RunConfig
from legorl.monitor.doctor import CheckFailed, check
from legorl.types import SamplingParams

PEARSON_MIN = 0.99  # the mismatch monitor's warning threshold (MonitorConfig.mismatch_pearson_warn)
PROBE = "<|im_start|>user\nThe tests in utils.py fail. Find the bug and fix it.<|im_end|>\n<|im_start|>assistant\n"
REPLAY_FIX = (
    "routing replay is miswired: set [trainer] routing_replay = true, have the engine record routing "
    "([engine] record_routing for hf, return_routed_experts for vllm/sglang) and serve the trainer's model "
    "(same layers and expert ids)"
)
NATURAL_DISAGREEMENT_MAX = 0.5  # k of E experts at random: 1 - 1/C(E, k) disagree (96% for 2 of 8)
EngineFactory = Callable[[Any], Any]  # tokenizer -> Engine


def _generate(cfg: RunConfig, tok: Any, factory: EngineFactory) -> tuple[list[int], Any]:
    ids = tok.encode(PROBE, add_special_tokens=False)
    params = SamplingParams(max_tokens=64, temperature=cfg.proxy.temperature, top_p=cfg.proxy.top_p, seed=0)

    async def go() -> Any:
        engine = factory(tok)
        try:
            return await asyncio.wait_for(engine.generate(ids, params), 120)
        finally:
            await engine.close()

    return ids, asyncio.run(go())


def dry_step(cfg: RunConfig, factory: EngineFactory | None = None) -> dict[str, float] | None:
    """Sample once with the engine, recompute with the trainer; the trainer's mismatch
    metrics plus `routing/replayed_share` (pairs the trainer routed as recorded) and
    `routing/natural_disagreement` (pairs its router alone would route elsewhere). None for a
    dense model. Raises CheckFailed when there is no recording to replay."""
    import torch

    from legorl.engine.registry import make_engine
    from legorl.models import load_tokenizer
    from legorl.train.batch import pack
    from legorl.train.mismatch import mismatch_metrics
    from legorl.train.routing import routing_mismatch
    from legorl.train.trainer import Trainer
    from legorl.types import AlignmentStats, Segment, Trajectory

    trainer = Trainer(cfg.trainer)
    if not trainer.policy.is_moe:
        return None
    tok = load_tokenizer(cfg.engine.model)
    ids, gen = _generate(cfg, tok, factory or (lambda t: make_engine(cfg.engine, t)))
    if gen.routed_experts is None:
        raise CheckFailed(
            f"{cfg.trainer.model} is an MoE model but the {cfg.engine.kind} engine recorded no routing: "
            "the trainer would route every token its own way",
            fix=REPLAY_FIX,
        )
    n, c = len(ids), len(gen.completion_ids)
    seg = Segment(
        [0], ids + gen.completion_ids, [0] * n + [1] * c, [0.0] * n + list(gen.logprobs), [0], gen.routed_experts
    )
    (mb,) = pack(
        [(0, Trajectory("doctor", [seg], AlignmentStats(), instance_id="doctor"), 1.0)], "trajectory", n + c + 1
    )
    with torch.no_grad():
        out = trainer.policy(mb.to(trainer.device), trainer.opts)
    m = mismatch_metrics(out.logprobs_N.cpu(), mb.rollout_logprobs_N, mb.mask_N)
    if out.used_N_L_K is not None and mb.replay_N_L_K is not None:
        valid = (mb.replay_N_L_K >= 0).all(-1).all(-1)
        used, total = routing_mismatch(out.used_N_L_K.cpu(), mb.replay_N_L_K, valid)
        natural, _ = routing_mismatch(out.natural_N_L_K.cpu(), mb.replay_N_L_K, valid)
        m["routing/replayed_share"] = 1 - used / total if total else 0.0
        m["routing/natural_disagreement"] = natural / total if total else 0.0
    m["tokens"] = float(c)
    return m


@check("routing replay wired", needs=("engine answers",), timeout=300)
def routing_replay_check(cfg: RunConfig, factory: EngineFactory | None = None) -> str:
    """`routing replay wired`: fatal below `PEARSON_MIN`, or with replay off for an MoE
    model. `factory` builds the engine from a tokenizer (default: the config's)."""
    m = dry_step(cfg, factory)
    if m is None:
        return f"{cfg.trainer.model} is dense: no routing to replay"
    r = m.get("mismatch/pearson", float("nan"))
    replayed = m.get("routing/replayed_share", 0.0)
    natural = m.get("routing/natural_disagreement", 0.0)
    said = (
        f"rollout/trainer Pearson {r:.4f} over {int(m['tokens'])} tokens; the trainer routed "
        f"{replayed:.0%} of (token, layer) pairs as recorded, its router alone would differ on {natural:.0%}"
    )
    if not cfg.trainer.routing_replay:
        raise CheckFailed(
            f"routing replay is off ([trainer] routing_replay = false) for the MoE model {cfg.trainer.model}: "
            f"{said}; any engine/trainer numerics difference re-routes tokens silently",
            fix=REPLAY_FIX,
        )
    if not r >= PEARSON_MIN:  # NaN included
        raise CheckFailed(f"routing replay: {said}, below {PEARSON_MIN}", fix=REPLAY_FIX)
    if natural > NATURAL_DISAGREEMENT_MAX:
        raise CheckFailed(
            f"routing replay: {said}: the recorded experts are not this model's routing "
            f"(more than {NATURAL_DISAGREEMENT_MAX:.0%} disagree)",
            fix=REPLAY_FIX,
        )
    return f"routing replay: {said}"
