"""Run store → ATIF (Harbor's Agent Trajectory Interchange Format, v1.8), one file per trajectory; and back.

ATIF is how Harbor, SkyRL, rLLM and the other trainers of the field exchange agent runs:
a trajectory is a list of steps (system, user, agent), and an agent step may carry the
exact `prompt_token_ids`, `completion_token_ids` and `logprobs` of its model call, so a
consumer can train on what was sampled without re-tokenising. We record exactly that per
turn, so the export is lossless where it matters:

- **One agent step per model call** (a `Turn`), with its true token ids and rollout
  logprobs in `metrics`. Between agent steps, what the harness added to the conversation
  (tool outputs, user text) becomes observations and user/system steps, read from the
  recorded request bodies of each dialect (`legorl.store.messages`).
- **Segments are kept apart.** Each agent step names its segment in
  `extra.legorl.segment`; the root's `extra.legorl.segments` lists them. A segment that
  runs inside another conversation (it starts while an earlier segment is still being
  continued, or the harness marks it so: Codex's `thread_source: "subagent"`) is a
  sub-agent: it becomes an embedded trajectory in `subagent_trajectories`, referenced
  from the parent's step that was current when it started. A segment that merely follows
  (a compaction) stays in the root's steps.
- **Side calls are marked** (`extra.legorl.side_call: true`): answered, trained only as
  segments of their own under `[harness] side_calls = "train"` (the exported `stats.side_calls`
  says which). They sit in the root's steps at their call position.

`read_turns` is the way back: an exported file (root and sub-agents) → the session's
`Turn`s, which `legorl.trajectory.assemble` turns into the same segments. MoE routing and
trainer logprobs are not part of ATIF and are not exported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from legorl.store import messages as msgs
from legorl.store.run_store import RunStore
from legorl.trajectory import assemble
from legorl.types import Dialect, FinishReason, Trajectory, Turn

SCHEMA_VERSION = "ATIF-v1.8"
EXTRA = "legorl"  # the key of our own fields inside ATIF's `extra` objects


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("legorl")
    except PackageNotFoundError:
        return "0"


def _harness_version(harness: str) -> str:
    """The pinned version of the harness's own layer, or legorl's (the `command` harness)."""
    from legorl.harness import install

    for name in (harness, harness.replace("_", "-")):
        layers = install.HARNESS_LAYERS.get(name)
        recipe = install.RECIPES.get(layers[-1]) if layers else None
        if recipe is not None and recipe.version:
            return recipe.version
    return _version()


def _iso(t: float) -> str | None:
    return datetime.fromtimestamp(t, tz=UTC).isoformat() if t > 0 else None


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


# ----------------------------------------------------------------- threads
def _thread_source(turn: Turn) -> str | None:
    """Codex's own word for the conversation a request belongs to ("user", "subagent")."""
    meta = (turn.request.get("client_metadata") or {}) if isinstance(turn.request, dict) else {}
    raw = meta.get("x-codex-turn-metadata") if isinstance(meta, dict) else None
    try:
        return json.loads(raw).get("thread_source") if isinstance(raw, str) else None
    except (ValueError, AttributeError):
        return None


def sub_agent_segments(traj: Trajectory, turns: dict[int, Turn]) -> set[int]:
    """Indices of the segments that are sub-agents' conversations.

    The root conversation is the segment of the first policy turn. Another segment is a
    sub-agent's when some segment that began before it is continued after it began (the
    parent waited for it and went on), or when the harness marks its first request so."""
    spans = [(min(s.turn_indices), max(s.turn_indices)) for s in traj.segments]
    if not spans:
        return set()
    root = min(range(len(spans)), key=lambda k: spans[k][0])
    subs = set()
    for k, (first, _) in enumerate(spans):
        if k == root:
            continue
        first_turn = turns.get(first)
        marked = first_turn is not None and _thread_source(first_turn) == "subagent"
        if marked or any(j != k and spans[j][0] < first < spans[j][1] for j in range(len(spans))):
            subs.add(k)
    return subs


# ----------------------------------------------------------------- steps
def _arguments(raw: Any) -> tuple[dict[str, Any], Any]:
    """ATIF wants a dict; anything else is kept verbatim beside an empty one."""
    if isinstance(raw, dict):
        return raw, None
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return {}, raw
        return (parsed, None) if isinstance(parsed, dict) else ({}, raw)
    return {}, raw


def _tool_call(call_id: str, name: Any, raw: Any) -> dict[str, Any]:
    args, verbatim = _arguments(raw)
    return _drop_none(
        {
            "tool_call_id": call_id,
            "function_name": str(name or ""),
            "arguments": args,
            "extra": {"raw_arguments": verbatim} if verbatim is not None else None,
        }
    )


def _turn_tool_calls(turn: Turn) -> list[dict[str, Any]]:
    out = []
    for j, call in enumerate(turn.tool_calls):
        fn = call.get("function", call)
        call_id = call.get("id") or call.get("call_id") or f"turn{turn.index}-call{j}"
        out.append(_tool_call(str(call_id), fn.get("name"), fn.get("arguments", fn.get("input", ""))))
    return out


class _Thread:
    """Builds the steps of one conversation (the root, or one sub-agent) in call order."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.shown: list[dict[str, Any]] | None = None  # display messages of the last policy request
        self.agent_steps: dict[int, dict[str, Any]] = {}  # policy turn index -> its agent step

    def _add(self, step: dict[str, Any]) -> dict[str, Any]:
        step["step_id"] = len(self.steps) + 1
        self.steps.append(step)
        return step

    def _observe(self, result: dict[str, Any]) -> None:
        """Attach a result to the step whose tool call it answers (else the latest step)."""
        cid = result.get("source_call_id")
        owner = next(
            (
                s
                for s in reversed(self.steps)
                if cid is not None and any(c["tool_call_id"] == cid for c in s.get("tool_calls", []))
            ),
            None,
        )
        if owner is None:
            result.pop("source_call_id", None)
            owner = self.steps[-1] if self.steps else self._add({"source": "system", "message": ""})
        owner.setdefault("observation", {"results": []})["results"].append(result)

    def context(self, turn: Turn) -> None:
        """Steps for what the harness added to the conversation since this thread's last call."""
        _, items, rest = msgs.split_request(turn.request)
        shown = msgs.system_messages(rest) + msgs.display_messages(items, str(turn.dialect))
        new = shown
        if self.shown is not None:
            n = 0
            while n < min(len(shown), len(self.shown)) and shown[n] == self.shown[n]:
                n += 1
            new = shown[n:]
            while new and new[0].get("role") == "assistant" and self.agent_steps:  # the echo of our own reply
                new = new[1:]
        self.shown = shown
        copied: dict[str, Any] | None = None  # history the harness handed over (e.g. after a compaction)
        for m in new:
            kind, text = m.get("kind"), m.get("text") or ""
            if m.get("role") == "assistant":
                if copied is None:
                    copied = self._add({"source": "agent", "message": "", "is_copied_context": True})
                if kind == "tool_call":
                    cid = m.get("call_id") or f"copied-{len(self.steps)}-{len(copied.get('tool_calls', []))}"
                    copied.setdefault("tool_calls", []).append(_tool_call(str(cid), m.get("name"), text))
                elif kind == "thinking" and text.strip():
                    copied["reasoning_content"] = ((copied.get("reasoning_content") or "") + "\n" + text).strip()
                else:
                    copied["message"] = (copied["message"] + "\n" + text).strip()
                continue
            if kind == "tool_result":
                self._observe(_drop_none({"source_call_id": m.get("call_id"), "content": text}))
                continue
            copied = None
            source = "system" if m.get("role") in ("system", "developer") else "user"
            self._add({"source": source, "message": text})

    def agent(self, turn: Turn, segment: int | None, policy: bool = True) -> dict[str, Any]:
        calls = _turn_tool_calls(turn)
        extra = {
            "turn_index": turn.index,
            "segment": segment,
            "side_call": turn.side_call,
            "dialect": str(turn.dialect),
            "finish_reason": str(turn.finish_reason),
            "policy_version": turn.policy_version,
            "format_error": turn.format_error,
            "sampling_used": turn.sampling_used,
        }
        metrics = {
            "prompt_tokens": len(turn.prompt_ids),
            "completion_tokens": len(turn.completion_ids),
            "prompt_token_ids": list(turn.prompt_ids),
            "completion_token_ids": list(turn.completion_ids),
            "logprobs": list(turn.logprobs),
        }
        step = self._add(
            _drop_none(
                {
                    "source": "agent",
                    "timestamp": _iso(turn.t_start),
                    "model_name": turn.model or None,
                    "message": turn.response_text,
                    "tool_calls": calls or None,
                    "metrics": metrics,
                    "llm_call_count": 1,
                    "extra": {EXTRA: extra},
                }
            )
        )
        if policy:
            self.agent_steps[turn.index] = step
        return step


def _tool_definitions(request: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The offered tools in OpenAI's function-calling shape (what ATIF asks for)."""
    out = []
    for tool in request.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":  # Codex's sub-agent tools: functions under one name
            out += _tool_definitions({"tools": tool.get("tools")}) or []
        elif "function" in tool:
            out.append(tool)
        elif "input_schema" in tool:  # Anthropic
            fn = {k: tool[k] for k in ("name", "description") if k in tool}
            out.append({"type": "function", "function": {**fn, "parameters": tool["input_schema"]}})
        elif tool.get("type", "function") == "function" and "name" in tool:  # Responses
            out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
        else:
            out.append(tool)  # a hosted tool: as the harness sent it
    return out or None


def _trajectory(thread: _Thread, *, sid: str, tid: str, agent: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    steps = thread.steps or [{"step_id": 1, "source": "system", "message": "no model call was recorded"}]
    metrics = [s["metrics"] for s in steps if "metrics" in s]
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": sid,
        "trajectory_id": tid,
        "agent": agent,
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": sum(m["prompt_tokens"] for m in metrics),
            "total_completion_tokens": sum(m["completion_tokens"] for m in metrics),
            "total_steps": len(steps),
        },
        "extra": {EXTRA: extra},
    }


def to_atif(
    traj: Trajectory | None,
    turns: list[Turn],
    *,
    session_id: str,
    advantage: float | None = None,
) -> dict[str, Any]:
    """One session as an ATIF trajectory dict (root, with its sub-agents embedded)."""
    turns = sorted(turns, key=lambda t: t.index)
    if traj is None or (turns and not traj.segments and any(not t.side_call for t in turns)):
        # Not yet assembled: the same rule the trainer will use, with the stored record's identity.
        known = traj
        traj = assemble(
            turns,
            session_id,
            instance_id=known.instance_id if known else "",
            harness=known.harness if known else "",
            step=known.step if known else 0,
            outcome=known.outcome if known else None,
        )
    by_index = {t.index: t for t in turns}
    seg_of = {i: k for k, s in enumerate(traj.segments) for i in s.turn_indices}
    subs = sub_agent_segments(traj, by_index)
    harness = traj.harness or "legorl"

    def agent(first: Turn | None) -> dict[str, Any]:
        """The agent of a conversation: its model and the tools its first policy call offered."""
        return _drop_none(
            {
                "name": harness,
                "version": _harness_version(harness),
                "model_name": (first.model or None) if first is not None else None,
                "tool_definitions": _tool_definitions(first.request) if first is not None else None,
                "extra": {EXTRA: {"exporter": f"legorl {_version()}"}},
            }
        )

    root = _Thread()
    threads = {k: _Thread() for k in sorted(subs)}
    sub_ids = {k: f"{session_id}#segment-{k}" for k in threads}
    referenced: set[int] = set()
    for t in turns:
        k = seg_of.get(t.index)
        if t.side_call or k is None:  # its request is its own conversation: its tokens say it all
            root.agent(t, None, policy=False)
            continue
        thread = threads.get(k, root)
        if thread is not root and k not in referenced and root.agent_steps:
            referenced.add(k)  # the parent's policy step current when the sub-agent started
            parent = root.agent_steps[max(root.agent_steps)]
            ref = {"subagent_trajectory_ref": [{"trajectory_id": sub_ids[k], "session_id": session_id}]}
            parent.setdefault("observation", {"results": []})["results"].append(ref)
        thread.context(t)
        thread.agent(t, k)
    segments = [
        {
            "index": k,
            "turn_indices": s.turn_indices,
            "n_tokens": len(s.token_ids),
            "n_sampled": int(sum(s.loss_mask)),
            "trajectory_id": sub_ids.get(k, session_id),
        }
        for k, s in enumerate(traj.segments)
    ]
    out = _trajectory(
        root,
        sid=session_id,
        tid=session_id,
        agent=agent(next((t for t in turns if not t.side_call and seg_of.get(t.index) not in subs), None)),
        extra={
            "instance_id": traj.instance_id,
            "step": traj.step,
            "harness": traj.harness,
            "outcome": traj.outcome.to_dict() if traj.outcome is not None else None,
            "advantage": advantage,
            "stats": traj.stats.__dict__,
            "side_turns": traj.side_turns,
            "segments": segments,
        },
    )
    if threads:
        out["subagent_trajectories"] = [
            _trajectory(
                th,
                sid=session_id,
                tid=sub_ids[k],
                agent=agent(by_index.get(traj.segments[k].turn_indices[0])),
                extra={"segment": k},
            )
            for k, th in threads.items()
        ]
    return out


# ----------------------------------------------------------------- files
def _file_name(session_id: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", session_id).strip("._") or "trajectory"
    name, n = f"{base}.json", 1
    while name in taken:
        n += 1
        name = f"{base}-{n}.json"
    taken.add(name)
    return name


def export_atif(store: RunStore, out_dir: Path | str) -> list[Path]:
    """Write one ATIF file per session of `store` into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    written = []
    for sid in store.iter_session_ids():
        with store._read() as c:
            row = c.execute("SELECT advantage FROM trajectories WHERE session_id=?", (sid,)).fetchone()
        doc = to_atif(
            store.load_trajectory(sid),
            store.load_turns(sid),
            session_id=sid,
            advantage=row["advantage"] if row is not None else None,
        )
        path = out / _file_name(sid, taken)
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS))
        written.append(path)
    return written


# ----------------------------------------------------------------- and back
def _agent_steps(doc: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for step in doc.get("steps", []):
        if step.get("source") == "agent" and not step.get("is_copied_context") and step.get("metrics"):
            yield step
    for sub in doc.get("subagent_trajectories") or []:
        yield from _agent_steps(sub)


def read_turns(doc: dict[str, Any] | Path | str) -> list[Turn]:
    """The model calls of an ATIF trajectory (root and sub-agents) as `Turn`s, in call order.

    Steps without token ids (another producer's, or copied context) are skipped: there is
    nothing to train on. A step with ids but no logprob for each completion token is a
    ValueError (never made up). Our own `extra.legorl` fields restore call order, dialect
    and side calls; without them steps count in file order as OpenAI-chat policy calls."""
    if not isinstance(doc, dict):
        doc = orjson.loads(Path(doc).read_bytes())
    sid = doc.get("session_id") or doc.get("trajectory_id") or ""
    turns = []
    for step in _agent_steps(doc):
        m, ours = step["metrics"], (step.get("extra") or {}).get(EXTRA, {})
        if m.get("completion_token_ids") is None or m.get("prompt_token_ids") is None:
            continue
        completion, logprobs = list(m["completion_token_ids"]), m.get("logprobs")
        if logprobs is None or len(logprobs) != len(completion):
            got = "no logprobs" if logprobs is None else f"{len(logprobs)} logprobs"
            raise ValueError(
                f"step {step.get('step_id')}: {got} for {len(completion)} completion tokens "
                "(training needs the sampler's logprob of every token)"
            )
        calls = [
            {
                "id": c["tool_call_id"],
                "type": "function",
                "function": {"name": c["function_name"], "arguments": json.dumps(c["arguments"])},
            }
            for c in step.get("tool_calls") or []
        ]
        turns.append(
            Turn(
                session_id=sid,
                index=int(ours.get("turn_index", len(turns))),
                dialect=Dialect(ours.get("dialect", Dialect.OPENAI_CHAT)),
                prompt_ids=list(m["prompt_token_ids"]),
                completion_ids=completion,
                logprobs=list(logprobs),
                finish_reason=FinishReason(ours.get("finish_reason", FinishReason.STOP)),
                sampling_used=ours.get("sampling_used") or {},
                response_text=step.get("message") if isinstance(step.get("message"), str) else "",
                tool_calls=calls,
                format_error=bool(ours.get("format_error", False)),
                side_call=bool(ours.get("side_call", False)),
                policy_version=int(ours.get("policy_version", 0)),
                model=step.get("model_name") or "",
            )
        )
    return sorted(turns, key=lambda t: t.index)
