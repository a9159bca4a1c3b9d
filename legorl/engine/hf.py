"""`hf`: an in-process transformers model that batches concurrent requests (CPU or GPU).

Many harness sessions call the engine at once; generating for them one at a time would
make a rollout as slow as the sum of its sessions. A dedicated generation thread runs a
continuous-batching loop instead: every iteration it admits waiting requests (prefilled
together as one left-padded batch), then advances every running request by one token in
a single decode forward over a shared KV cache (`kv_batch.py`). Requests join and leave
between steps. Prompts are prefilled in chunks of `prefill_chunk` columns, so a long agent
context never materialises a prompt x prompt attention mask; while a wave of prompts is
prefilled, running requests wait (no interleaving of prefill chunks with decode steps).
The thread keeps the asyncio event loop (which also serves the HTTP proxy) free: each
iteration's tokens are handed back with one `call_soon_threadsafe` per caller loop.

What each request gets back (see `sampling.py` for the exact distribution):
- one `TokenStep` per sampled token with `logprob = log q(token)`, q being the
  temperature/top-k/top-p-processed distribution it was drawn from (greedy: log softmax
  at T = 1);
- a final step with the finish reason: `stop` on an end-of-turn/eos id (the id is
  included in the completion) or when the decoded completion contains a stop string
  (the completing token is included; trimming text is the proxy's job), `length` at
  `max_tokens` or at the model's context limit;
- for MoE models, `routed_experts[t][l][k]` for every prompt and completion token
  (`routing.py`). The last sampled token is forwarded once more so that it, too, has
  its routing — the shape is exactly (prompt + completion, MoE layers, top-k).

Architectures: besides full attention, the batch handles sliding-window layers (gpt-oss, which
loads with eager attention for its sinks) and hybrid models whose linear-attention layers
(Qwen3.5's Gated-DeltaNet) keep a per-row conv + recurrent state instead of KV columns
(`kv_batch.py`); MoE routing is recorded from every family's router (`routing.py`). A model
whose every layer is a sliding window (harness-qwen3: 256 back, under 15-28k-token harness
prompts) keeps only each row's last `window` columns, so regrouping, masks and decode attention
cost the window, not the transcript.

Prefixes: an agent's next turn re-sends its transcript, so the KV columns of a finished
request are kept (`kv_prefix.py`, at most `prefix_cache_tokens` columns and `prefix_cache_mb`
of memory, least recently used out first: 32k columns of SmolLM2-135M in fp32 are 1.5 GB) and
a new request that starts with the same tokens copies them in and prefills only the rest.
Requests that reuse are prefilled apart from those that do not (one forward
covers every row from the longest remaining suffix on). A prompt is kept as soon as it is
prefilled, not only when its request finishes: the sessions of one harness start at once and
share its system prompt and tool list (~7k tokens for Claude Code), and a GSPO group's
rollouts share their whole first prompt. Within one admitted wave, a request that shares a
prefix with a later one in the same wave is prefilled first, alone (a lead), and the others
copy its columns. A row cut to its window (every layer windowed) is not stored when it
finishes (a stored prefix holds every token's columns); its prompt, stored at prefill (the
reused prefix's columns joined to its own), serves the next turn, whose remaining suffix
costs little to prefill over a window's worth of columns.
The store is emptied when the weights change; models with
linear-attention layers and MoE models recording routing do not reuse.

Seeds: a request with `seed` samples with its own generator, so its completion does not
depend on the other requests in the batch (up to floating-point effects of batch shape).

Weights: `load_state_dict(state_dict, version)` (thread-safe, between two steps) and
`update_weights_from_disk(path, version)` copy new weights in place and set
`policy_version`. Requests in flight continue under the new weights (their KV cache keeps
what the old weights computed), as in asynchronous RL systems; a turn's policy version is
the one the proxy reads when the turn ends.

CPU threads: the generation thread sets its own intra-op thread count (OpenMP's is per
thread, so a trainer in the same process keeps its own). The default is
min(4, cores // 2): tiny models are bound by Python overhead, and on a busy machine more
threads than free cores make OpenMP spin — on 2 loaded cores, 2 threads measured ~20x
slower per decode step than 1.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from legorl.compute_thread import in_own_thread
from legorl.engine.base import EngineError, check_prompt, collect
from legorl.engine.hf_rows import Outbox, Request, Row, eos_ids
from legorl.engine.kv_batch import BatchedForward, KVBatch, regroup, row_prefix
from legorl.engine.kv_prefix import Prefix, PrefixStore, common_prefix
from legorl.engine.routing import RoutingRecorder, moe_gates
from legorl.engine.sampling import params_tensors, processed_logprobs, sample, validate_params
from legorl.models import load_tokenizer, resolve_model
from legorl.types import FinishReason, Generation, SamplingParams, TokenStep

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(model: str, device: str, dtype: str, attn_implementation: str) -> torch.nn.Module:
    """An HF causal LM from a bundled name or a local directory, on `device`, in eval mode.

    An architecture without an SDPA implementation (gpt-oss: attention sinks) is loaded with
    `eager` attention when `sdpa` was asked for, rather than refused."""
    import transformers
    from transformers import AutoModelForCausalLM

    path = resolve_model(model)
    bar = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        torch_dtype: Any = "auto" if dtype == "auto" else DTYPES[dtype]
        try:
            net = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation)
        except ValueError as exc:
            if attn_implementation != "sdpa" or "scaled_dot_product_attention" not in str(exc):
                raise
            net = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation="eager")
    finally:
        if bar:
            transformers.utils.logging.enable_progress_bar()
    return net.to(device).eval()


class HFEngine:
    """Continuous-batching generation with an in-process transformers model."""

    name = "hf"
    Options: ClassVar[type | None] = None  # no `[engine] options`: every setting is an `[engine]` field

    def __init__(
        self,
        model: str = "tiny-qwen3",
        tokenizer: Any = None,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 32,
        max_prefill_tokens: int = 16384,
        prefill_chunk: int = 1024,
        max_context: int | None = None,
        num_threads: int | None = None,
        seed: int | None = None,
        record_routing: bool = True,
        attn_implementation: str = "sdpa",
        prefix_cache_tokens: int = 32768,
        prefix_cache_mb: float = 512.0,
    ) -> None:
        if dtype != "auto" and dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of auto, {', '.join(DTYPES)}")
        self.num_threads = num_threads or min(4, max(1, (os.cpu_count() or 2) // 2))
        self.model_name = model
        self.model = load_model(model, device, dtype, attn_implementation)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.prefill_chunk = prefill_chunk
        self.max_context = int(max_context or getattr(self.model.config, "max_position_embeddings", 0) or 2**31)
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self.policy_version = 0
        self.eos_ids = eos_ids(self.tokenizer, self.model)
        self.routing = RoutingRecorder(self.model) if record_routing else None
        if self.routing is not None and not self.routing.gates:
            self.routing.close()
            self.routing = None
        self.is_moe = bool(moe_gates(self.model))
        self._fwd = BatchedForward(self.model)
        reuse = prefix_cache_tokens > 0 and self._fwd.reusable() and self.routing is None
        self._prefixes = PrefixStore(prefix_cache_tokens, max_bytes=int(prefix_cache_mb * 2**20)) if reuse else None
        self._prefixes_version = 0  # the weights the stored columns were computed by
        self._generator = torch.Generator(device=self.device)
        if seed is not None:
            self._generator.manual_seed(seed)
        else:
            self._generator.seed()  # this generator only; the global torch RNG is left alone
        self._cv = threading.Condition()
        self._model_lock = threading.Lock()
        self._pending: deque[Request] = deque()
        self._outbox = Outbox()
        self._rows: list[Row] = []
        self._batch: KVBatch | None = None
        self._closing = False
        self.stats = {"forward_calls": 0, "decode_steps": 0, "max_rows": 0, "tokens": 0}
        self.stats |= {"prompt_tokens": 0, "reused_tokens": 0}  # reused: copied from a finished row, not computed
        self._thread = threading.Thread(target=self._loop, name="legorl-hf-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, cfg: Any, tokenizer: Any = None) -> HFEngine:
        return cls(
            cfg.model,
            tokenizer,
            device=cfg.device,
            dtype=cfg.dtype,
            max_batch_size=cfg.max_batch_size,
            max_prefill_tokens=cfg.max_prefill_tokens,
            prefill_chunk=cfg.prefill_chunk,
            max_context=cfg.max_context,
            num_threads=cfg.num_threads,
            seed=cfg.seed,
            record_routing=cfg.record_routing,
            attn_implementation=cfg.attn_implementation,
            prefix_cache_tokens=cfg.prefix_cache_tokens,
            prefix_cache_mb=cfg.prefix_cache_mb,
        )

    # ---- asyncio side -------------------------------------------------------------------

    def _check(self, prompt_ids: list[int], params: SamplingParams) -> np.ndarray:
        """The prompt as an int64 array, once checked (one vectorised pass: harness prompts
        are 15-30k ids, and a per-id Python check cost a millisecond a request)."""
        validate_params(params)
        ids_N = np.asarray(prompt_ids)
        if ids_N.ndim != 1 or (ids_N.size and ids_N.dtype.kind not in "iu"):  # not plain ints: one at a time
            ids_N = np.asarray([int(t) if 0 <= int(t) < self.vocab_size else -1 for t in prompt_ids], dtype=np.int64)
        ids_N = ids_N.astype(np.int64, copy=False)
        bad_N = np.flatnonzero((ids_N < 0) | (ids_N >= self.vocab_size))
        if bad_N.size:
            bad = [int(prompt_ids[i]) for i in bad_N[:5].tolist()]
            raise ValueError(f"prompt_ids has ids outside the vocabulary [0, {self.vocab_size}): {bad}")
        check_prompt(prompt_ids, self.max_context)
        if self._closing:
            raise EngineError("hf engine is closed")
        return ids_N

    @property
    def records_routing(self) -> bool:
        return self.routing is not None

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        ids_N = self._check(prompt_ids, params)
        loop = asyncio.get_running_loop()
        req = Request(ids_N.tolist(), params, loop, self._outbox, self.tokenizer, self.device, prompt_N=ids_N)
        with self._cv:
            self._pending.append(req)
            self._cv.notify()
        done = False
        try:
            while True:
                item = await req.queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                yield item
                if item.finish_reason is not None:
                    done = True
                    return
        finally:
            if not done:
                req.cancelled = True
                with self._cv:
                    self._cv.notify()

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        await asyncio.to_thread(self._thread.join, 60)
        if self.routing is not None:
            self.routing.close()

    # ---- weights ------------------------------------------------------------------------

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy (a subset of) the model's parameters in place, between two generation steps."""
        own = self.model.state_dict()
        unknown = [k for k in state_dict if k not in own]
        if unknown:
            raise ValueError(f"update_weights: {len(unknown)} names the model does not have, e.g. {unknown[:3]}")
        wrong = [k for k, v in state_dict.items() if tuple(v.shape) != tuple(own[k].shape)]
        if wrong:
            k = wrong[0]
            raise ValueError(
                f"update_weights: shape of {k} is {tuple(state_dict[k].shape)}, model has {tuple(own[k].shape)}"
            )
        with self._model_lock, torch.no_grad():
            for k, v in state_dict.items():
                own[k].copy_(v.detach().to(device=own[k].device, dtype=own[k].dtype))
            self.policy_version = int(version)  # the generation thread empties the prefix store on seeing it

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        await in_own_thread(self.load_state_dict, state_dict, version)

    async def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        """Load an HF checkpoint directory (same architecture) and copy its weights in."""
        if not (Path(path) / "config.json").exists():
            raise ValueError(f"update_weights_from_disk: {path} is not an HF model directory (no config.json)")

        def load() -> None:
            fresh = load_model(str(path), "cpu", "float32", "eager")
            self.load_state_dict(fresh.state_dict(), version)

        await in_own_thread(load)

    # ---- generation thread --------------------------------------------------------------

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        if self.device.type == "cpu":
            torch.set_num_threads(self.num_threads)  # this thread only
        while True:
            with self._cv:
                while not self._closing and not self._pending and not self._rows:
                    self._cv.wait()
                if self._closing:
                    break
                admitted = self._admit()
            try:
                self._drop_cancelled(force=bool(admitted))
                with self._model_lock:
                    if admitted:
                        self._prefill(admitted)
                    if self._rows:
                        self._decode()
            except Exception as exc:  # a failed step fails its requests, not the engine
                err = EngineError(f"hf engine step failed: {type(exc).__name__}: {exc}")
                for row in self._rows:
                    row.req.fail(err)
                for req in admitted:
                    req.fail(err)
                self._rows, self._batch = [], None
            self._outbox.flush()
        for row in self._rows:
            row.req.emit(TokenStep(None, None, FinishReason.ABORT))
        for req in self._pending:
            req.emit(TokenStep(None, None, FinishReason.ABORT))
        self._outbox.flush()
        self._rows, self._batch = [], None
        self._pending.clear()

    def _admit(self) -> list[Request]:
        """Waiting requests that fit in the batch and the prefill token budget (under _cv)."""
        admitted: list[Request] = []
        while self._pending and len(self._rows) + len(admitted) < self.max_batch_size:
            req = self._pending[0]
            if req.cancelled:
                self._pending.popleft()
                continue
            longest = max([len(r.prompt_ids) for r in admitted] + [len(req.prompt_ids)])
            if admitted and longest * (len(admitted) + 1) > self.max_prefill_tokens:
                break
            admitted.append(self._pending.popleft())
        return admitted

    def _drop_cancelled(self, force: bool = False) -> None:
        """Store finished rows' columns at once; drop finished and cancelled rows from the batch
        only when a quarter of it is dead (or `force`, before an admission). Dropping copies every
        live row's KV cache (`regroup`): with harness-length contexts (6-12k columns a row) a copy
        per finished row cost more than the decode steps themselves, while a dead row left in the
        batch costs one more row of a small decode step, its output unused."""
        store = self._store()
        if store is not None and self._batch is not None:
            for i, row in enumerate(self._rows):
                # its columns (every token but the last sampled), if today's weights computed all of them
                if row.done and not row.stored and not row.req.cancelled and row.version == self._prefixes_version:
                    self._put(store, row_prefix(self._batch, i, row.tokens))
                row.stored = row.stored or row.done
        keep = [i for i, row in enumerate(self._rows) if not (row.done or row.req.cancelled)]
        dead = len(self._rows) - len(keep)
        if dead and self._batch is not None and (force or not keep or 4 * dead >= len(self._rows)):
            self._batch = regroup([(self._batch, keep)], self._fwd.keep)
            self._rows = [self._rows[i] for i in keep]

    @staticmethod
    def _put(store: PrefixStore, prefix: Prefix | None) -> None:
        if prefix is not None:  # None: a row cut to its window (every layer windowed)
            store.put(prefix)

    def _bound_window(self) -> None:
        """Every layer windowed: cut the batch back to the window once decode steps have grown
        it to twice that, so a long generation between admissions does not grow it without end
        (one copy of `window` columns a row per `window` steps)."""
        keep = self._fwd.keep
        if keep is not None and self._batch is not None and self._batch.valid_B_S.shape[1] >= 2 * keep:
            self._batch = regroup([(self._batch, list(range(len(self._rows))))], keep)

    def _prefill(self, admitted: list[Request]) -> None:
        """Prefill the admitted requests: leads first (their prompts are then in the store),
        then those that reuse a stored prefix apart from the rest (one forward covers every
        row from the longest remaining suffix on). Every prompt computed without reuse is kept."""
        store = self._store()
        leads = self._leads(store, admitted) if store is not None else []
        waves = [leads, [req for req in admitted if req not in leads]] if leads else [admitted]
        parts: list[tuple[KVBatch, list[Row]]] = []
        for wave in waves:
            for group in self._groups(wave):
                batch, rows = self._prefill_group(group)
                if store is not None:
                    self._keep_prompts(store, batch, group, rows)
                parts.append((batch, rows))
        old = [(self._batch, list(range(len(self._rows))))] if self._batch is not None else []
        self._batch = regroup(
            old + [(batch, [r for r, row in enumerate(rows) if not row.done]) for batch, rows in parts],
            self._fwd.keep,
        )
        self._rows = self._rows + [row for _, rows in parts for row in rows if not row.done]
        self.stats["max_rows"] = max(self.stats["max_rows"], len(self._rows))

    def _store(self) -> PrefixStore | None:
        """The prefix store, emptied first if the weights changed since its columns were
        computed (only this thread touches it; `load_state_dict` only bumps the version)."""
        if self._prefixes is not None and self._prefixes_version != self.policy_version:
            self._prefixes.clear()
            self._prefixes_version = self.policy_version
        return self._prefixes

    def _leads(self, store: PrefixStore, admitted: list[Request]) -> list[Request]:
        """Requests no stored prefix covers that share at least `min_reuse` tokens with a later
        request of the wave, one per shared prefix: prefilled first so that the others copy
        their columns instead of computing the same ones side by side."""
        unmatched = [req for req in admitted if store.match(req.prompt_N) is None]
        leads: list[Request] = []
        lead_ids: list[np.ndarray] = []
        for i, req in enumerate(unmatched):
            if any(common_prefix(ids, req.prompt_N) >= store.min_reuse for ids in lead_ids):
                continue  # an earlier lead's prompt will cover it
            ids = req.prompt_N
            if any(common_prefix(ids, other.prompt_N) >= store.min_reuse for other in unmatched[i + 1 :]):
                leads.append(req)
                lead_ids.append(ids)
        return leads

    def _keep_prompts(
        self,
        store: PrefixStore,
        batch: KVBatch,
        group: list[tuple[Request, tuple[Prefix, int] | None]],
        rows: list[Row],
    ) -> None:
        """Store the prompt columns of the group's rows that reused nothing. A row that reused
        holds mostly columns the store has already, and is stored whole when it finishes;
        unless every layer is windowed: it is cut then, so its prompt is stored now, the
        reused prefix's columns and its own (otherwise each later turn of a session would
        reuse only what its first prompt shared with another session's)."""
        for r, ((req, match), row) in enumerate(zip(group, rows, strict=True)):
            if row.version != self._prefixes_version:
                continue
            if match is None:
                self._put(store, row_prefix(batch, r, req.prompt_ids))
            elif self._fwd.keep is not None:
                self._put(store, row_prefix(batch, r, req.prompt_ids, reused=match))

    def _groups(self, admitted: list[Request]) -> list[list[tuple[Request, tuple[Prefix, int] | None]]]:
        store = self._store()
        if store is None:
            return [[(req, None) for req in admitted]]
        matched = [(req, store.match(req.prompt_N)) for req in admitted]
        groups = [[(q, m) for q, m in matched if m is not None], [(q, m) for q, m in matched if m is None]]
        return [g for g in groups if g]

    def _prefill_group(self, group: list[tuple[Request, tuple[Prefix, int] | None]]) -> tuple[KVBatch, list[Row]]:
        prompts = [req.prompt_ids for req, _ in group]
        reused = [m for _, m in group]
        if self.routing is not None:
            self.routing.start()
        batch, logits_B_V = self._fwd.prefill(prompts, self.prefill_chunk, reused)  # all None: nothing copied
        self.stats["forward_calls"] = self._fwd.forward_calls
        self.stats["prompt_tokens"] += sum(map(len, prompts))
        self.stats["reused_tokens"] = self._fwd.reused_columns
        rows = [Row(req, self.policy_version) for req, _ in group]
        if self.routing is not None:
            idx_B_T_L_K = self.routing.take(len(prompts))
            for r, row in enumerate(rows):
                row.routing.append(idx_B_T_L_K[r, idx_B_T_L_K.shape[1] - len(row.req.prompt_ids) :])
        self._sample(rows, logits_B_V)
        self._finish(rows)
        return batch, rows

    def _decode(self) -> None:
        assert self._batch is not None
        if self.routing is not None:
            self.routing.start()
        logits_B_V = self._fwd.decode(
            self._batch, [row.tokens[-1] for row in self._rows], [len(row.tokens) - 1 for row in self._rows]
        )
        self.stats["decode_steps"] += 1
        self.stats["forward_calls"] = self._fwd.forward_calls
        if self.routing is not None:
            idx_B_T_L_K = self.routing.take(len(self._rows))
            for r, row in enumerate(self._rows):
                if not row.done:  # a finished row still in the batch (see _drop_cancelled) routes nothing
                    row.routing.append(idx_B_T_L_K[r])
        live = [r for r, row in enumerate(self._rows) if row.finish is None and not row.req.cancelled]
        if live:
            self._sample([self._rows[r] for r in live], logits_B_V[live])
        self._finish(self._rows)
        self._drop_cancelled()
        self._bound_window()

    def _finish(self, rows: list[Row]) -> None:
        """Send the final step of rows that stopped (MoE rows once their last token is routed)."""
        for row in rows:
            if row.finish is not None and not row.done and (self.routing is None or row.routed_all()):
                row.req.emit(TokenStep(None, None, row.finish, row.routed_experts() if self.routing else None))
                row.done = True

    def _sample(self, rows: list[Row], logits_B_V: torch.Tensor) -> None:
        params = [row.req.params for row in rows]
        temperature_B, top_p_B, top_k_B = params_tensors(params, self.device)
        logprobs_B_V = processed_logprobs(logits_B_V, temperature_B, top_p_B, top_k_B)
        ids_B = sample(logprobs_B_V, temperature_B <= 0, [row.req.generator for row in rows], self._generator)
        lps_B = logprobs_B_V.gather(1, ids_B[:, None]).squeeze(1).tolist()
        self.stats["tokens"] += len(rows)
        for row, tok, lp in zip(rows, ids_B.tolist(), lps_B, strict=True):
            row.add(tok, lp, self.eos_ids, self.max_context, self.policy_version)  # under _model_lock
