"""The RL vocabulary of LEGO-RL (docs/architecture.md, "Vocabulary") as plain dataclasses.

This is the only data model shared between the proxy, the sandboxes, the trainer and the
run store: every component speaks in these words, so a record written by one can be read
by any other. Token-level arrays are plain lists here (they cross process and JSON
boundaries); the trainer turns them into tensors with shape-suffixed names. The one
exception is MoE routing: (tokens, layers, top-k) expert indices are ~300 numbers per
token for a 40-layer top-8 model, so they travel as one compact int16 numpy array
(`Routing`), never as nested lists (which would cost ~120 bytes per token-layer).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Routing = np.ndarray  # int16, shape (tokens, MoE layers, top-k): the experts each token was routed to
ROUTING_DTYPE = np.int16


def as_routing(value: Any) -> Routing | None:
    """Routing from an engine, a JSON record or a tensor as an int16 (tokens, layers, k)
    array; None stays None. Raises ValueError for anything not of that shape."""
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.dtype == ROUTING_DTYPE and value.ndim == 3:
        return value  # already one (the engines return these): no second scan of ~300 numbers a token
    try:
        arr_T_L_K = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"routed_experts must be a rectangular (tokens, layers, top_k) array: {e}") from e
    if arr_T_L_K.size == 0 and arr_T_L_K.ndim < 3:
        return np.zeros((0, 0, 0), dtype=ROUTING_DTYPE)
    if arr_T_L_K.ndim != 3:
        raise ValueError(f"routed_experts must have shape (tokens, layers, top_k), got {arr_T_L_K.shape}")
    if arr_T_L_K.size and (arr_T_L_K.min() < -1 or arr_T_L_K.max() > np.iinfo(ROUTING_DTYPE).max):
        raise ValueError("routed_experts holds expert indices outside -1..32767")
    return arr_T_L_K.astype(ROUTING_DTYPE, copy=False)


def _routing_json(d: dict[str, Any]) -> dict[str, Any]:
    """asdict() copies arrays as they are; JSON wants nested lists."""
    if isinstance(d.get("routed_experts"), np.ndarray):
        d["routed_experts"] = d["routed_experts"].tolist()
    return d


class Dialect(enum.StrEnum):
    """The HTTP API a harness speaks to the proxy."""

    OPENAI_CHAT = "openai_chat"
    ANTHROPIC = "anthropic"
    RESPONSES = "responses"
    GEMINI = "gemini"


class FinishReason(enum.StrEnum):
    """Why the engine stopped generating a completion."""

    STOP = "stop"  # an end-of-turn token or a stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # cancelled (client went away, engine shut down)


class Status(enum.StrEnum):
    """How a rollout ended. Doubles as metric keys (`status/<value>`).

    Agent-caused statuses are trained on with their reward; infrastructure statuses are
    retried and finally become `infra_error`, which is masked out of the loss and out of
    its group's statistics (an infrastructure fault must never look like a reward of 0).
    """

    RESOLVED = "resolved"
    FAILED = "failed"
    NO_PATCH = "no_patch"
    AGENT_TIMEOUT = "agent_timeout"
    MAX_TURNS = "max_turns"
    FORMAT_ERROR = "format_error"
    AGENT_CRASH = "agent_crash"
    HACK_DETECTED = "hack_detected"
    SANDBOX_START_FAILED = "sandbox_start_failed"
    ENGINE_ERROR = "engine_error"
    GRADER_ERROR = "grader_error"
    INFRA_ERROR = "infra_error"

    @property
    def is_infra(self) -> bool:
        return self in INFRA_STATUSES


INFRA_STATUSES = frozenset({Status.SANDBOX_START_FAILED, Status.ENGINE_ERROR, Status.GRADER_ERROR, Status.INFRA_ERROR})


@dataclass(frozen=True)
class SamplingParams:
    """What the engine samples with. Chosen by the trainer's config, never by the harness."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 1024
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Generation:
    """One completion as the engine produced it.

    `logprobs[i]` is the log-probability of `completion_ids[i]` under the distribution the
    token was actually sampled from (see the engine's docstring for temperature/top-p).
    `routed_experts[t, l]` holds the top-k expert indices of token t (prompt tokens first,
    then completion tokens) in MoE layer l; None for dense models or when not returned.
    """

    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    routed_experts: Routing | None = None
    prompt_tokens: int = 0


@dataclass
class TokenStep:
    """One streamed engine step: a sampled token, or the final step with the finish reason."""

    token_id: int | None
    logprob: float | None
    finish_reason: FinishReason | None = None
    routed_experts: Routing | None = None  # only on the final step
    # The oldest policy version whose weights sampled a token of this step (None: the engine
    # reports no per-token versions). A request in flight across a weight update has tokens
    # of two versions; the turn records the oldest, so staleness is never understated.
    policy_version: int | None = None


@dataclass
class Turn:
    """One model call as the engine saw it; the unit the proxy records.

    `routed_experts` covers positions `routing_base ..` of prompt + completion. The proxy
    drops the rows a turn shares with the turn before it in the same segment (the engine
    re-reports the whole prompt's routing every call): kept whole, an episode's routing
    would grow with turns x context, gigabytes for a long MoE episode.
    """

    session_id: str
    index: int
    dialect: Dialect
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    sampling_used: dict[str, Any]
    sampling_requested: dict[str, Any] = field(default_factory=dict)
    request: dict[str, Any] = field(default_factory=dict)  # the raw request body
    response_text: str = ""  # the text the client received (tool calls included as parsed)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    routed_experts: Routing | None = None
    routing_base: int = 0
    format_error: bool = False
    side_call: bool = False  # answered, but not part of the policy's trajectory
    policy_version: int = 0  # the oldest version that sampled one of its tokens (engines that say)
    model: str = ""
    t_start: float = 0.0
    t_first_token: float = 0.0
    t_end: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return _routing_json(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        d = dict(d)
        d["dialect"] = Dialect(d["dialect"])
        d["finish_reason"] = FinishReason(d["finish_reason"])
        d["routed_experts"] = as_routing(d.get("routed_experts"))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Segment:
    """A maximal run of turns in which each prompt extends the previous prompt+completion.

    `token_ids` is the first turn's prompt followed by everything after it; `loss_mask[i]`
    is 1 only for tokens the policy sampled; `logprobs[i]` is the rollout logprob there
    (0.0 where the mask is 0).
    """

    turn_indices: list[int]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    routed_experts: Routing | None = None  # (len(token_ids) or one less, L, K)


@dataclass(frozen=True)
class Outcome:
    """How a rollout was judged: reward, status and the evidence behind it.

    Frozen: built once with everything known (for a rollout, by `legorl.loop.record`) and
    never amended after, so every reader (the trainer, the store, the monitors) sees the
    verdict its one author wrote. Its lists and dicts are left alone too, by the same rule.
    """

    reward: float
    status: Status
    masked: bool = False  # excluded from loss and group statistics (infra errors)
    flags: list[str] = field(default_factory=list)  # e.g. "tamper_attempt"
    tests: dict[str, str] = field(default_factory=dict)  # test id -> passed/failed/error/skipped/missing
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class AlignmentStats:
    """How a session's turns were assembled and how well they chained token-for-token."""

    tokens: int = 0  # total tokens over segments
    sampled_tokens: int = 0  # mask-1 tokens over segments: what the loss may see
    segments: int = 0
    reused_prompt_tokens: int = 0  # prompt tokens that were an exact prefix continuation
    first_divergence: dict[str, int] | None = None  # {"turn": i, "token": position}
    # how side calls were assembled (`trajectory.SideCalls`): "separate" lists them apart, never
    # trained; "train" makes them segments of their own, after the main conversation's, under the
    # rollout's one advantage. Kept here so the stored record says what its segments hold.
    side_calls: str = "separate"
    side_segments: int = 0  # of `segments`, those built from side calls (the last ones)


@dataclass(frozen=True)
class Trajectory:
    """All segments of one session, plus its outcome once graded.

    Frozen, like `Outcome`: whoever builds one knows every field (`trajectory.assemble`
    takes the identity fields and the outcome as arguments); nothing is stamped on later.
    """

    session_id: str
    segments: list[Segment]
    stats: AlignmentStats
    instance_id: str = ""
    harness: str = ""
    step: int = 0
    outcome: Outcome | None = None
    side_turns: list[int] = field(default_factory=list)  # the side calls; segments too when stats.side_calls == "train"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["segments"] = [_routing_json(seg) for seg in d["segments"]]
        return d


@dataclass
class Task:
    """One SWE-bench-format problem (plus where its repository lives locally)."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    repo_path: str = ""  # absolute path of a git repository or bundle
    test_cmd: str = ""
    env_setup: str = ""
    image: str = ""  # an image-cache key, or a Docker image present locally (`docker load`ed; never pulled)
    split: str = "train"
    version: str = ""  # the official instance's repository version
    log_parser: str = ""  # the official parser of its runner's log (a key of swebench's PARSER_REGISTRY)
    requirements: list[str] = field(default_factory=list)  # wheels its tests need, installed offline (an env layer)
    # "" for a SWE-bench-format task (graded by its FAIL_TO_PASS/PASS_TO_PASS tests); "harbor"
    # for a Harbor task directory (`task_dir`), graded by the reward its own verifier writes.
    kind: str = ""
    task_dir: str = ""
