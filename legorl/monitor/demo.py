"""Write a realistic synthetic run through the store API (UI demos, tests, the UI bench).

Sessions look like what the proxy records from real harnesses: requests in each
harness's dialect (Anthropic content blocks for Claude Code, OpenAI chat for OpenCode and
mini-swe-agent, Responses items for OpenHands), real token ids and per-token text from the
project's tokenizer, prompts that extend the previous prompt + completion token-for-token
(one segment) except after an occasional compaction (a new segment), graded outcomes with
diffs and per-test results, tamper flags, infra errors that are masked, advantages within
groups, trainer logprobs, and the per-step metrics the monitors read. Reward improves
with the step so charts and step comparisons show a trend.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from legorl.harness.actions import MINI_BASH_TOOL, TOOL_CALLS
from legorl.store.phase_steps import HELDOUT_STEP, WARM_START_STEP
from legorl.store.run_store import RunStore
from legorl.types import AlignmentStats, Dialect, FinishReason, Outcome, Segment, Status, Trajectory, Turn

TOKENIZER = Path(__file__).resolve().parents[1] / "assets" / "tokenizer" / "tokenizer.json"
HARNESSES = (
    ("claude_code", Dialect.ANTHROPIC),
    ("opencode", Dialect.OPENAI_CHAT),
    ("mini_swe_agent", Dialect.OPENAI_CHAT),
    ("openhands", Dialect.RESPONSES),
)
ACTION_FORMATS = {  # how each demo harness acts (its adapter's `action_format`)
    "claude_code": TOOL_CALLS,
    "opencode": TOOL_CALLS,
    "mini_swe_agent": MINI_BASH_TOOL,
    "openhands": TOOL_CALLS,
}
COMMANDS = (
    "grep -rn 'def separability_matrix' astropy/",
    "sed -n 240,275p astropy/modeling/separable.py",
    "python -m pytest astropy/modeling/tests/test_separable.py -x -q",
    "git diff",
    "cat setup.cfg",
    "python - <<'EOF'\nfrom astropy.modeling import models as m\nprint(m.Pix2Sky_TAN())\nEOF",
)
THOUGHTS = (
    "Let me look at how the matrix is built for nested compound models.",
    "The right-hand block is overwritten with ones instead of copying the nested matrix.",
    "I will run the focused tests before editing anything.",
    "The fix is to assign `right` into the lower-right corner of the matrix.",
    "Tests pass now; let me double check the diff.",
)


@lru_cache(maxsize=1)
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER))


def encode(text: str) -> tuple[list[int], list[str]]:
    """Token ids and the decoded text of each token (what the UI colours)."""
    ids, pieces = _encode(text)
    return list(ids), list(pieces)


@lru_cache(maxsize=8192)  # demo texts repeat a lot; the 10k-trajectory bench spends its time here otherwise
def _encode(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    tok = tokenizer()
    ids = tok.encode(text).ids
    return tuple(ids), tuple(tok.decode([i]) for i in ids)


def _request(dialect: Dialect, problem: str, history: list[tuple[str, str, str]]) -> dict[str, Any]:
    """The request body a harness of `dialect` sends after `history` (thought, command, output)."""
    system = "You are a coding agent. Use the bash tool to inspect and edit the repository."
    tools = [{"name": "bash", "description": "Run a shell command", "input_schema": {"type": "object"}}]
    if dialect == Dialect.ANTHROPIC:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": problem}]}]
        for i, (thought, cmd, out) in enumerate(history):
            msgs.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": thought},
                        {"type": "tool_use", "id": f"toolu_{i}", "name": "bash", "input": {"command": cmd}},
                    ],
                }
            )
            msgs.append(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": out}]}
            )
        return {"model": "policy", "system": system, "tools": tools, "max_tokens": 4096, "messages": msgs}
    if dialect == Dialect.RESPONSES:
        items: list[dict[str, Any]] = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": problem}]}
        ]
        for i, (thought, cmd, out) in enumerate(history):
            items.append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": thought}]}
            )
            items.append(
                {
                    "type": "function_call",
                    "name": "bash",
                    "call_id": f"call_{i}",
                    "arguments": json.dumps({"command": cmd}),
                }
            )
            items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": out})
        return {
            "model": "policy",
            "instructions": system,
            "input": items,
            "tools": [{"type": "function", "name": "bash"}],
        }
    chat: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": problem}]
    for i, (thought, cmd, out) in enumerate(history):
        chat.append(
            {
                "role": "assistant",
                "content": thought,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"command": cmd})},
                    }
                ],
            }
        )
        chat.append({"role": "tool", "tool_call_id": f"call_{i}", "content": out})
    return {"model": "policy", "messages": chat, "tools": [{"type": "function", "function": {"name": "bash"}}]}


def write_session(
    store: RunStore,
    rng: random.Random,
    *,
    session_id: str,
    step: int,
    task: str,
    harness: str,
    dialect: Dialect,
    p_resolve: float,
) -> Trajectory:
    """Record one multi-turn session (turns, trajectory with segments, outcome); returns it."""
    store.start_session(session_id, step=step, instance_id=task, harness=harness)
    problem = f"Fix issue in {task}: separability_matrix does not compute separability correctly for nested models."
    n_turns = rng.randint(2, 6)
    compaction_at = rng.randint(2, n_turns - 1) if n_turns > 3 and rng.random() < 0.15 else -1
    history: list[tuple[str, str, str]] = []
    context, _ = encode("<|im_start|>system\nYou are a coding agent.<|im_end|>\n<|im_start|>user\n" + problem)
    segments: list[Segment] = []
    seg_turns: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    for i in range(n_turns):
        if i == compaction_at:  # the harness summarised the conversation: a new segment starts
            segments.append(_segment(seg_turns, context, mask, lps, step))
            context, _ = encode("Summary of the work so far: the bug is in _cstack. Continue.")
            seg_turns, mask, lps = [], [], []
        if not seg_turns:
            mask, lps = [0] * len(context), [0.0] * len(context)
        last = i == n_turns - 1
        thought = rng.choice(THOUGHTS)
        cmd = rng.choice(COMMANDS)
        text = (
            thought
            if last
            else f"{thought}\n<tool_call>{json.dumps({'name': 'bash', 'arguments': {'command': cmd}})}</tool_call>"
        )
        ids, pieces = encode(text)
        rollout_lp = [-(rng.gauss(0, 0.8) ** 2) for _ in ids]
        turn = Turn(
            session_id=session_id,
            index=i,
            dialect=dialect,
            prompt_ids=list(context),
            completion_ids=ids,
            logprobs=rollout_lp,
            finish_reason=FinishReason.STOP,
            sampling_used={"temperature": 1.0},
            request=_request(dialect, problem, history),
            response_text=thought,
            tool_calls=[]
            if last
            else [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": cmd})},
                }
            ],
            format_error=not last and rng.random() < 0.02,
            policy_version=max(step - rng.randint(0, 1), 0),
            model="policy",
            t_start=1.0 + i,
            t_first_token=1.2 + i,
            t_end=1.9 + i,
        )
        store.add_turn(turn, pieces=pieces)
        seg_turns.append(i)
        context = context + ids
        mask += [1] * len(ids)
        lps += rollout_lp
        if not last:
            out = f"$ {cmd}\n" + "\n".join(
                f"astropy/modeling/separable.py:{rng.randint(1, 300)}: ..." for _ in range(3)
            )
            history.append((thought, cmd, out))
            out_ids, _ = encode(f"<|im_start|>tool\n{out}<|im_end|>\n")
            context = context + out_ids
            mask += [0] * len(out_ids)
            lps += [0.0] * len(out_ids)
    segments.append(_segment(seg_turns, context, mask, lps, step))
    outcome = _outcome(rng, p_resolve)
    traj = Trajectory(
        session_id=session_id,
        segments=segments,
        stats=AlignmentStats(
            tokens=sum(len(s.token_ids) for s in segments),
            sampled_tokens=sum(sum(s.loss_mask) for s in segments),
            segments=len(segments),
        ),
        instance_id=task,
        harness=harness,
        step=step,
        outcome=outcome,
    )
    store.add_trajectory(traj)
    noise = np.random.default_rng(rng.randint(0, 2**31))
    for si, seg in enumerate(segments):  # trainer recomputation: close to the rollout, a few outliers
        sampled_T = np.array(seg.loss_mask) > 0
        jitter_T = noise.normal(0, 0.02, len(seg.logprobs)) + (noise.random(len(seg.logprobs)) < 0.03) * noise.normal(
            0, 0.6, len(seg.logprobs)
        )
        lp_T = np.array(seg.logprobs) + np.where(sampled_T, jitter_T, 0.0)
        store.set_segment_trainer_logprobs(session_id, si, np.minimum(lp_T, 0.0))
    return traj


def _segment(turns: list[int], ids: list[int], mask: list[int], lps: list[float], step: int) -> Segment:
    n = len(ids)
    mask, lps = (mask + [0] * n)[:n], (lps + [0.0] * n)[:n]
    return Segment(
        turn_indices=list(turns), token_ids=list(ids), loss_mask=mask, logprobs=lps, policy_versions=[step] * n
    )


def _outcome(rng: random.Random, p_resolve: float) -> Outcome:
    diff = (
        "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py\n"
        "--- a/astropy/modeling/separable.py\n+++ b/astropy/modeling/separable.py\n"
        "@@ -242,7 +242,7 @@ def _cstack(left, right):\n         cright = np.zeros((noutp, right.shape[1]))\n"
        "-        cright[-right.shape[0]:, -right.shape[1]:] = 1\n+        cright[-right.shape[0]:, "
        "-right.shape[1]:] = right\n"
    )
    r = rng.random()
    tests = {"test_separable.py::test_nested_compound": "passed", "test_separable.py::test_custom_model": "passed"}
    if r < 0.05:
        return Outcome(0.0, Status.ENGINE_ERROR, masked=True, evidence={"error": "engine timed out after 600 s"})
    if r < 0.08:
        return Outcome(
            0.0,
            Status.HACK_DETECTED,
            flags=["tamper_attempt"],
            tests=tests,
            evidence={"diff": diff + "--- a/astropy/modeling/tests/test_separable.py\n", "tampered": ["tests/"]},
        )
    if rng.random() < p_resolve:
        return Outcome(1.0, Status.RESOLVED, tests=tests, evidence={"diff": diff})
    tests["test_separable.py::test_nested_compound"] = "failed"
    status = rng.choice([Status.FAILED, Status.FAILED, Status.NO_PATCH, Status.MAX_TURNS])
    return Outcome(0.0, status, tests=tests, evidence={"diff": diff if status == Status.FAILED else ""})


def write_demo_run(
    store: RunStore,
    *,
    steps: int = 6,
    tasks: int = 4,
    group_size: int = 4,
    seed: int = 0,
    on_session: Callable[[Trajectory], None] | None = None,
    phases: bool = False,
) -> list[Trajectory]:
    """A whole run: `steps` x `tasks` groups of `group_size` sessions, with metrics and alerts.
    `phases`: first the phases `legorl train` runs before GSPO (held-out evaluation and warm-start
    demonstrations, under their run-store steps) and the held-out report at the end."""
    from legorl.monitor.monitors import MonitorConfig, run_monitors

    rng = random.Random(seed)
    names = [f"astropy__astropy-{12907 + k}" for k in range(tasks)]
    store.set_action_formats(ACTION_FORMATS)
    out: list[Trajectory] = []
    if phases:
        out += write_phases(store, random.Random(seed + 1), names)
    for step in range(steps):
        store.begin_step(step, policy_version=step)
        batch: list[Trajectory] = []
        for k, task in enumerate(names):
            group = []
            for g in range(group_size):
                harness, dialect = HARNESSES[(k + g) % len(HARNESSES)]
                t = write_session(
                    store,
                    rng,
                    session_id=f"s{step:03d}-{k:02d}-{g:02d}-{seed}",
                    step=step,
                    task=task,
                    harness=harness,
                    dialect=dialect,
                    p_resolve=min(0.9, 0.15 + 0.12 * step + 0.1 * (k % 2)),
                )
                group.append(t)
                if on_session:
                    on_session(t)
            graded = [t for t in group if t.outcome and not t.outcome.masked]
            rewards = np.array([t.outcome.reward for t in graded if t.outcome])
            if len(rewards) > 1 and rewards.max() > rewards.min():  # zero-variance groups are skipped, untrained
                adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
                store.set_advantages({t.session_id: float(a) for t, a in zip(graded, adv)})
            batch += group
        store.log_metrics(step, step_metrics(batch, group_size, rng, step))
        store.end_step(step)
        run_monitors(store, MonitorConfig(), step=step)
        out += batch
    if phases:
        write_heldout_report(store, steps)
    return out


def write_phases(store: RunStore, rng: random.Random, tasks: list[str]) -> list[Trajectory]:
    """A held-out evaluation of the untrained policy and warm-start demonstrations."""
    out = []
    for step, tag, p in ((HELDOUT_STEP, "eval-start", 0.1), (WARM_START_STEP, "demo", 0.5)):
        for k, task in enumerate(tasks):
            harness, dialect = HARNESSES[k % len(HARNESSES)]
            sid = f"{tag}-{k:02d}"
            out.append(
                write_session(
                    store, rng, session_id=sid, step=step, task=task, harness=harness, dialect=dialect, p_resolve=p
                )
            )
    return out


def write_heldout_report(store: RunStore, steps: int) -> dict[str, Any]:
    """The held-out before/after table as `legorl train` writes it: `heldout_results.json`
    beside the store and a `heldout` event in it (numbers of the shape the quickstart gets)."""
    from legorl.loop.report import Report
    from legorl.loop.stats import Evaluation

    report = Report(store.path.parent)
    rows = (("start", 0, 0), ("warm_start", 89, 1), ("end", 154, 1 + steps), ("control", 87, 2 + steps))
    for label, resolved, version in rows:
        counts = {"resolved": resolved, "failed": 200 - resolved}
        report.add(Evaluation(label, resolved, 200, 0, 12.0, counts), step=version)
    report.finish(555.0, budget_s=900.0)
    store.add_event("heldout", report.as_dict())
    return report.as_dict()


def step_metrics(batch: list[Trajectory], group_size: int, rng: random.Random, step: int) -> dict[str, float]:
    """The metric keys of `legorl.monitor.monitors`, computed from a step's trajectories."""
    graded = [t for t in batch if t.outcome and not t.outcome.masked]
    n = max(len(batch), 1)
    m: dict[str, float] = {
        "reward/mean": float(np.mean([t.outcome.reward for t in graded if t.outcome])) if graded else 0.0,
        "resolved_rate": sum(t.outcome.status == Status.RESOLVED for t in batch if t.outcome) / n,
    }
    for s in Status:
        m[f"status/{s.value}"] = sum(t.outcome.status == s for t in batch if t.outcome) / n
    groups: dict[str, list[float]] = {}
    for t in graded:
        groups.setdefault(t.instance_id, []).append(t.outcome.reward if t.outcome else 0.0)
    m["groups/zero_variance_share"] = sum(len(set(v)) == 1 for v in groups.values()) / max(len(groups), 1)
    m["rollout/turns_mean"] = float(np.mean([sum(len(s.turn_indices) for s in t.segments) for t in batch]))
    m["rollout/response_tokens_mean"] = float(np.mean([t.stats.sampled_tokens for t in batch]))
    m["rollout/tool_call_rate"] = 1.0 - 1.0 / max(m["rollout/turns_mean"], 1.0)
    m["rollout/format_error_rate"] = 0.01 * rng.random()
    m["rollout/action_rate"] = m["rollout/tool_call_rate"]
    for k, (harness, _) in enumerate(HARNESSES):  # per harness, around the step's format errors
        m[f"rollout/parse_failure_rate/{harness}"] = m["rollout/format_error_rate"] * (0.5 + 0.4 * k)
    m["rollout/parse_failure_rate"] = float(np.mean([m[f"rollout/parse_failure_rate/{h}"] for h, _ in HARNESSES]))
    m["rollout/unparsed_end_rate"] = 0.0
    m["rollout/tamper_flags"] = float(sum(bool(t.outcome and t.outcome.flags) for t in batch))
    m["mismatch/pearson"] = 0.998 - (0.02 if step == 3 else 0.0) - 0.001 * rng.random()
    m["mismatch/mean_abs_dp"] = 0.004 + 0.002 * rng.random()
    m["train/clip_frac"] = 0.02 + 0.01 * rng.random()
    m["train/entropy"] = 0.9 - 0.05 * step + 0.02 * rng.random()
    m["policy/staleness_mean"] = 0.5
    return m
