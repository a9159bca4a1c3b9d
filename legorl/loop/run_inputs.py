"""A run's inputs that can be checked in a second before the set-up spends its minutes.

Each check turns a foreseeable mistake into one line naming the setting and what to do
(`RunError`), where it would otherwise surface as a traceback from deep in a library
(transformers' loader for a model directory without weights) or as a run that trains on
nothing (an HTTP engine nobody answers at: every rollout masked, a step of no data
trained and checkpointed, and the run ending only at the weight sync).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from legorl.engine.base import Engine
from legorl.engine.http_client import HTTPEngineClient
from legorl.loop.config import RunConfig
from legorl.loop.errors import RunError
from legorl.models import BUNDLED

WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
PROBE_TIMEOUT_S = 10.0


def check_weights(cfg: RunConfig) -> None:
    """Every model whose weights the run loads, when it is a local directory, holds weights
    next to its config.json (a half-copied or tokenizer-only directory is named, not loaded)."""
    fields = [("trainer.model", cfg.trainer.model)]
    if cfg.engine.kind == "hf":
        fields.append(("engine.model", cfg.engine.model))
    if cfg.warm_start.episodes and cfg.warm_start.engine.kind == "hf":
        fields.append(("warm_start.engine.model", cfg.warm_start.engine.model))
    for where, name in fields:
        path = Path(name).expanduser()
        if name in BUNDLED or not (path / "config.json").is_file():
            continue  # a bundled name, or not a local directory (check_models named it already)
        if not any(next(path.glob(g), None) for g in WEIGHT_GLOBS):
            raise RunError(
                f"{where}: {path} has a config.json but no weights ({' or '.join(WEIGHT_GLOBS)}): point it "
                "at a complete model directory (a checkpoint's model/ directory holds both)"
            )


async def probe_engine(engine: Engine, field: str = "engine") -> None:
    """One cheap request (`GET /health`) to an HTTP engine before the first rollout: a
    server that does not answer (or answers 5xx) ends the run in one line, before anything
    is rolled out or trained. An in-process engine has nothing to probe."""
    http = getattr(engine, "http", None)  # the vllm and sglang clients keep theirs here
    if not isinstance(http, HTTPEngineClient):
        return
    try:
        resp = await http.client.get("/health", timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as e:
        raise RunError(
            f"{field}.url {http.base_url} does not answer ({type(e).__name__}: {e or 'no reply'}): start the "
            f"{http.engine} server there first (docs/scale-out.md), or fix {field}.url"
        ) from None
    if resp.status_code >= 500:
        raise RunError(
            f"{field}.url {http.base_url} answers /health with HTTP {resp.status_code}: the {http.engine} server "
            "is not ready (still loading, or failed); wait for it, or restart it"
        )
