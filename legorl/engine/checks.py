"""`legorl doctor`'s engine checks: the engine answers a generation by token ids, and an HTTP
engine (`vllm` / `sglang`) reports processed (temperature-scaled) logprobs, not raw log-softmax.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from legorl.monitor.doctor import CheckFailed, check
from legorl.types import SamplingParams

if TYPE_CHECKING:
    from legorl.loop.config import RunConfig


@check("engine answers", timeout=120)
def engine_check(cfg: RunConfig) -> str:
    from legorl.engine.base import EngineError
    from legorl.engine.registry import make_engine
    from legorl.models import load_tokenizer

    tok = load_tokenizer(cfg.engine.model)
    ids = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)

    async def go() -> Any:
        engine = make_engine(cfg.engine, tok)
        try:
            return await asyncio.wait_for(
                engine.generate(ids, SamplingParams(max_tokens=4, temperature=1.0, seed=0)), 60
            )
        finally:
            await engine.close()

    try:
        gen = asyncio.run(go())
    except (EngineError, OSError, asyncio.TimeoutError) as e:
        where = cfg.engine.url or cfg.engine.kind
        raise CheckFailed(
            f"engine {where} did not answer: {type(e).__name__}: {e}",
            fix=f"start the {cfg.engine.kind} server at {cfg.engine.url} or fix engine.url"
            if cfg.engine.url
            else "check the [engine] section (kind, model, device)",
        ) from None
    if len(gen.logprobs) != len(gen.completion_ids) or not gen.completion_ids:
        raise CheckFailed(
            f"engine returned {len(gen.completion_ids)} ids and {len(gen.logprobs)} logprobs",
            fix="the engine must return one logprob per sampled token",
        )
    return f"{cfg.engine.kind}:{cfg.engine.model} generated {len(gen.completion_ids)} tokens"


@check(
    "engine logprobs mode",
    needs=("engine answers",),
    timeout=180,
    when=lambda cfg: cfg.engine.kind in ("vllm", "sglang"),
)
def logprobs_mode_check(cfg: RunConfig) -> str:
    """A server started without `--logprobs-mode processed_logprobs` reports raw T=1
    log-softmax: importance ratios would be wrong by the temperature. Recompute one token."""
    import torch
    from transformers import AutoModelForCausalLM

    from legorl.engine.registry import make_engine
    from legorl.engine.sampling import processed_logprobs
    from legorl.models import load_tokenizer, resolve_model

    tok = load_tokenizer(cfg.engine.model)
    ids = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    params = SamplingParams(max_tokens=8, temperature=2.0, seed=0)

    async def go() -> Any:
        engine = make_engine(cfg.engine, tok)
        try:
            return await asyncio.wait_for(engine.generate(ids, params), 60)
        finally:
            await engine.close()

    gen = asyncio.run(go())
    model_dir = cfg.engine.served_model_dir or resolve_model(cfg.engine.model)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = gen.completion_ids
    with torch.no_grad():
        logits_T_V = lm(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1].float()
    n = len(out)
    processed_T = processed_logprobs(
        logits_T_V, torch.full((n,), params.temperature), torch.ones(n), torch.full((n,), -1)
    )[torch.arange(n), out]
    raw_T = torch.log_softmax(logits_T_V, -1)[torch.arange(n), out]
    k = int((processed_T - raw_T).abs().argmax())  # the token that tells the two modes apart best
    got, processed, raw = gen.logprobs[k], processed_T[k].item(), raw_T[k].item()
    if abs(got - processed) < 1e-2 and abs(got - processed) < abs(got - raw):
        return f"processed logprobs (token {k}: server {got:.4f}, recomputed {processed:.4f}, raw {raw:.4f})"
    if abs(got - raw) < 1e-2:
        flag = "--logprobs-mode processed_logprobs" if cfg.engine.kind == "vllm" else "processed logprobs"
        raise CheckFailed(
            f"the server reports raw log-softmax logprobs ({got:.4f}; processed at T=2 is {processed:.4f})",
            fix=f"restart the {cfg.engine.kind} server with {flag}",
        )
    raise CheckFailed(
        f"the server's logprob {got:.4f} is neither the processed ({processed:.4f}) nor the raw "
        f"({raw:.4f}) one of {model_dir}",
        fix="serve the trainer's model (engine.model / engine.served_model_dir) in float32",
    )
