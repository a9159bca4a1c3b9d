"""Engine config and construction: `make_engine(cfg, tokenizer)` from a name → dotted path.

Built-ins are found through `ENGINES` (imported only when chosen, so a CPU install
never imports an HTTP engine's extras and vice versa). A target is either a class with
`from_config(cfg, tokenizer)` or any callable `(cfg, tokenizer) -> Engine`. Engines that
live outside this package (the `oracle`, a user's own) register the same way; settings
that only they understand go in `options`, declared by the target's `Options` dataclass
(`None`: it takes none) and checked against it when the config loads. A target without
`Options` (a user's factory) checks its own.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

from pydantic import Field, model_validator

from legorl.config_base import Section
from legorl.engine.base import Engine
from legorl.options import check_options, declared

ENGINES: dict[str, str] = {
    "hf": "legorl.engine.hf:HFEngine",
    "vllm": "legorl.engine.vllm:VLLMEngine",
    "sglang": "legorl.engine.sglang:SGLangEngine",
    "scripted": "legorl.engine.scripted:ScriptedEngine",
    "oracle": "legorl.engine.oracle:OracleEngine",
    "quickstart-expert": "legorl.quickstart.expert:ExpertEngine",
}


class EngineConfig(Section):
    """`[engine]`: which engine generates, and how."""

    kind: str = "hf"
    """Engine: `hf` (in-process transformers), `vllm` / `sglang` (HTTP servers), `scripted` (replays completions),
    `oracle`, `quickstart-expert` (the quickstart's scripted demonstrator; `options.p_read`), or any kind
    added with `register_engine`: the registry (`ENGINES`) is the one list of kinds, read when a config loads."""
    model: str = "tiny-qwen3"
    """Bundled model name (`tiny-qwen3`, `tiny-qwen3-moe`) or a local HF model directory; its tokenizer renders
    prompts."""
    device: str = "cpu"
    """`hf`: torch device, `cpu`, `cuda` or `cuda:N`."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    """`hf`: parameter dtype (`auto` = the checkpoint's)."""
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    """`hf`: attention kernel."""
    max_batch_size: int = Field(32, ge=1)
    """`hf`: most requests decoded together; more wait their turn."""
    max_prefill_tokens: int = Field(16384, ge=1)
    """`hf`: most (padded) prompt tokens prefilled in one forward when several requests arrive at once."""
    prefill_chunk: int = Field(1024, ge=1)
    """`hf`: prompt columns per prefill forward (bounds the attention mask's memory for long prompts)."""
    max_context: int | None = Field(None, ge=2)
    """Context length (prompt + completion); default: the model config's `max_position_embeddings` (HTTP engines:
    32768)."""
    num_threads: int | None = Field(None, ge=1)
    """`hf` on CPU: intra-op threads of the generation thread only (default min(4, cores // 2))."""
    seed: int | None = None
    """`hf`: seed of the generator used by requests without their own seed."""
    prefix_cache_tokens: int = Field(32768, ge=0)
    """`hf`: KV columns of finished requests kept for the next request that starts with the same tokens (an agent's
    next turn re-sends its transcript); cleared when the weights change; 0 turns reuse off."""
    prefix_cache_mb: float = Field(512.0, gt=0)
    """`hf`: the most memory those kept columns may take, in MiB (whichever bound is reached first evicts the
    least recently used); a column of SmolLM2-135M in fp32 is 45 kB, of the quickstart's model 1 kB."""
    record_routing: bool = True
    """`hf`: record routed experts of MoE models (costs one extra forward of each request's last token)."""
    url: str | None = None
    """`vllm` / `sglang`: server base URL, e.g. `http://127.0.0.1:8000`."""
    served_model_name: str | None = None
    """`vllm`: the `model` field of requests (default: `model`)."""
    served_model_dir: str | None = None
    """`vllm`: the directory the server was launched on; weight updates are written there and reloaded."""
    api_key: str | None = None
    """`vllm` / `sglang`: bearer token if the server was started with one."""
    stream: bool = True
    """`vllm` / `sglang`: stream tokens as they are generated (SSE)."""
    return_routed_experts: bool = False
    """`vllm` / `sglang`: ask for routed experts (server needs `--enable-return-routed-experts`)."""
    moe_top_k: int | None = Field(None, ge=1)
    """`sglang`: experts per token, needed to shape the routing SGLang returns flat."""
    max_concurrency: int = Field(256, ge=1)
    """`vllm` / `sglang`: most requests in flight to the server."""
    request_timeout_s: float = Field(600.0, gt=0)
    """`vllm` / `sglang`: longest wait for the server, per request and per silent gap in a stream."""
    scripted_completions: list[str | list[int]] = Field(default_factory=list)
    """`scripted`: completions to replay (text is tokenised with the model's tokenizer; or token ids)."""
    scripted_mode: Literal["cycle", "per_session"] = "cycle"
    """`scripted`: one global cycle, or the n-th completion for a prompt holding n assistant turns."""
    scripted_append_eos: bool = True
    """`scripted`: end text completions with `<|im_end|>`."""
    scripted_moe: tuple[int, int, int] | None = None
    """`scripted`: fake routing shape (layers, top_k, experts), for MoE plumbing tests."""
    scripted_latency_s: float = Field(0.0, ge=0)
    """`scripted`: delay before each completion."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Engine-specific settings: the fields of the engine's `Options` (`vllm`: `route`; `oracle`: `tasks`, ...;
    `quickstart-expert`: `p_read`; `hf`, `sglang`, `scripted`: none), checked when the config loads."""

    @model_validator(mode="after")
    def _needs(self) -> EngineConfig:
        if self.kind not in ENGINES:
            raise ValueError(f"engine.kind {self.kind!r} is not a registered engine (known: {', '.join(ENGINES)})")
        if self.kind in ("vllm", "sglang") and not self.url:
            raise ValueError(f"engine.url is required when engine.kind = {self.kind!r}")
        if self.kind == "scripted" and not self.scripted_completions:
            raise ValueError(
                "engine.scripted_completions must list at least one completion when engine.kind = 'scripted'"
            )
        if self.options:  # only then is the engine's module imported
            known = engine_options(self.kind)
            if known is not None:
                self.options = check_options(self.options, known, f"engine kind {self.kind!r}")
        return self


def register_engine(kind: str, target: str) -> None:
    """Make `make_engine` build `kind` from `module.path:Name`."""
    if ":" not in target:
        raise ValueError(f"engine target {target!r}: expected 'package.module:Name'")
    ENGINES[kind] = target


def resolve(kind: str) -> Any:
    """Import the class/factory registered for `kind`, with a clear error if it is missing."""
    if kind not in ENGINES:
        raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(sorted(ENGINES))}")
    module_name, _, attr = ENGINES[kind].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ValueError(
                f"engine kind {kind!r} is implemented by {ENGINES[kind]}, but module {module_name} is not installed"
            ) from exc
        raise
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ValueError(f"engine kind {kind!r}: module {module_name} has no {attr}") from exc


def engine_options(kind: str) -> dict[str, Any] | None:
    """The `options` engine `kind` takes (name → type) from its `Options`; None when the
    target declares nothing (a user's factory, which checks its own)."""
    target = resolve(kind)
    if not hasattr(target, "Options"):
        return None
    return {} if target.Options is None else declared(target.Options)


def make_engine(cfg: EngineConfig, tokenizer: Any = None) -> Engine:
    """Build the configured engine. `tokenizer` defaults to the model's."""
    target = resolve(cfg.kind)
    if tokenizer is None and cfg.kind in ("scripted", "oracle", "quickstart-expert"):
        from legorl.models import load_tokenizer

        tokenizer = load_tokenizer(cfg.model)
    factory = getattr(target, "from_config", target)
    return factory(cfg, tokenizer)
