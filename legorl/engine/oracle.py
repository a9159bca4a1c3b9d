"""`oracle`: a known-good policy that solves a task with its gold patch, through any harness.

Why: every harness must be shown to run end to end — install, launch, proxy, tools in the
sandbox, its own way of finishing, compaction, grading — before a real model is trained
through it, and a tiny random model can only show the failure paths. The oracle is an
engine (token ids in, token ids out, like every other), so the proxy, the recorded turns
and the assembled trajectory are exactly those of a real run: its completions are real
tokens of the model's tokenizer and its trajectories are token-exact training data.

How it decides (stateless, from the prompt alone, so concurrency and compaction need no
bookkeeping): the prompt ids are decoded; the tools come from the rendered system block
(`<tools>` JSON lines, see proxy/chatml_renderer.py); the task is the one whose problem statement
appears in the prompt (or whose `legorl-oracle:task=` marker does, after a compaction);
the progress is the highest `legorl-oracle:step-N` marker in the conversation (every
action carries one, and so does every summary it writes). The plan a competent agent
follows, through the harness's shell tool:

  1. inspect the repository        (`git status`, `ls`, the files the patch touches)
  2. apply the gold patch          (heredoc into a file, `git apply`, `patch -p1` fallback)
  3. run the tests, review         (the task's `test_cmd` or pytest, output tail; the diff and
                                    the changed files again)
  4. finish the harness's way      (`finish` tool if offered — OpenHands; the
                                    `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` echo if the
                                    system prompt asks for it — mini-swe-agent; otherwise a
                                    final text answer — Claude Code, OpenCode)

With `delegate`, the first action hands the whole task to the harness's sub-agent tool
instead (Claude Code's `Agent`, OpenCode's `task`, Codex's `spawn_agent`, then its
`wait_agent` for the id it got back); the sub-agent, whose prompt carries the
`legorl-oracle:delegated` marker, follows the plan itself, and its report's step marker
lets the parent finish.

A request without tools (OpenCode's, OpenHands' and Pi's summarisers, title generators) or with
Claude Code's "Do NOT call any tools" or Codex's "CONTEXT CHECKPOINT COMPACTION" instruction gets plain text: a title or
an `<analysis>`/`<summary>` that carries the task and step markers forward. A prompt that
ends inside an assistant message (OpenCode's "maximum steps reached" prefill) is
continued with text only.

Logprobs: every sampled token gets the same fixed value (`logprob`, default 0.0): the
oracle is deterministic, so each token it emits has probability 1 under its own policy.
Stop strings and `max_tokens` cut the completion exactly as a real engine would.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from legorl.engine.base import check_prompt, collect
from legorl.types import FinishReason, Generation, SamplingParams, TokenStep

MARK = "legorl-oracle"
_STEP_RE = re.compile(re.escape(MARK) + r":step-(\d+)")
_TASK_RE = re.compile(re.escape(MARK) + r":task=([^\s`'\"<>]+)")
_TOOLS_RE = re.compile(r"within <tools></tools> XML tags:\n<tools>\n(.*?)\n</tools>", re.DOTALL)
_WS = re.compile(r"\s+")
SHELL_NAMES = ("bash", "terminal", "execute_bash", "shell", "run_shell_command", "exec", "run", "exec_command")
COMMAND_KEYS = ("command", "cmd")  # the shell tool's command parameter (`cmd`: Codex's exec_command)
SUBMIT_WORD = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
COMPACT_HINTS = ("Do NOT call any tools", "Respond with plain text only", "CONTEXT CHECKPOINT COMPACTION")
STEPS = 4
PATCH_EOF = "LEGORL_ORACLE_PATCH_EOF"
# Sub-agent tools: Claude Code's `Agent` (formerly `Task`) and OpenCode's `task` {prompt}
# answer with the sub-agent's report; Codex's `spawn_agent` {message} answers with an agent
# id at once, and `wait_agent` {targets} then waits for the report.
DELEGATE_NAMES = ("agent", "task", "spawn_agent")
DELEGATE_KEYS = ("prompt", "message")
WAIT_NAMES = ("wait_agent",)
_AGENT_ID_RE = re.compile(r'"agent_id"\s*:\s*"([^"]+)"')  # spawn_agent's answer
DELEGATED = f"{MARK}:delegated"


@dataclass(frozen=True)
class OracleTask:
    """What the oracle knows of one task."""

    instance_id: str
    problem_statement: str
    patch: str
    test_cmd: str = ""


@dataclass
class PromptView:
    """A decoded prompt, split into what the oracle looks at."""

    system: str
    tools: list[dict[str, Any]]
    messages: list[tuple[str, str]]  # (role, text) after the system block
    open_assistant: str | None  # text of an unfinished trailing assistant message (prefill)
    text: str = ""

    @property
    def conversation(self) -> str:
        return "\n".join(t for _, t in self.messages) + (self.open_assistant or "")

    def last_user(self) -> str:
        for role, t in reversed(self.messages):
            if role == "user":
                return t
        return ""


def parse_prompt(text: str) -> PromptView:
    """Split a prompt rendered by proxy/chatml_renderer.py (Qwen-style ChatML) into its parts."""
    system, tools, messages, open_text = "", [], [], None
    blocks = text.split("<|im_start|>")[1:]
    for i, block in enumerate(blocks):
        role, _, body = block.partition("\n")
        closed = "<|im_end|>" in body
        body = body.split("<|im_end|>", 1)[0]
        if i == 0 and role == "system":
            m = _TOOLS_RE.search(body)
            if m:
                for line in m.group(1).splitlines():
                    try:
                        t = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(t, dict):
                        tools.append(t.get("function", t) if isinstance(t.get("function"), dict) else t)
                body = body[: body.find("# Tools")].rstrip("\n") if "# Tools" in body else body
            system = body
            continue
        if i == len(blocks) - 1 and role == "assistant" and not closed:
            open_text = body
            continue
        messages.append((role, body))
    return PromptView(system, tools, messages, open_text or None, text)


def _params_schema(tool: dict[str, Any]) -> dict[str, Any]:
    schema = tool.get("parameters") or tool.get("input_schema") or {}
    return schema if isinstance(schema, dict) else {}


def command_key(tool: dict[str, Any]) -> str | None:
    """The parameter of `tool` that takes the shell command (`command`, or Codex's `cmd`)."""
    props = _params_schema(tool).get("properties", {}) or {}
    return next((k for k in COMMAND_KEYS if k in props), None)


def find_shell(tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The tool that runs shell commands: a known name first, else any tool with a
    required `command` (or `cmd`) string parameter."""
    by_name = {str(t.get("name", "")).lower(): t for t in tools}
    for n in SHELL_NAMES:
        if n in by_name and command_key(by_name[n]):
            return by_name[n]
    for t in tools:
        key = command_key(t)
        if key and key in (_params_schema(t).get("required", []) or []):
            return t
    return None


def delegate_key(tool: dict[str, Any]) -> str | None:
    """The parameter of a sub-agent tool that takes its task (`prompt`, or Codex's `message`)."""
    props = _params_schema(tool).get("properties", {}) or {}
    return next((k for k in DELEGATE_KEYS if k in props), None)


def find_delegate(tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A sub-agent tool: a known name with a `prompt` (or `message`) parameter."""
    for t in tools:
        if str(t.get("name", "")).lower() in DELEGATE_NAMES and delegate_key(t):
            return t
    return None


def find_wait(tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The tool that waits for a sub-agent started in the background (Codex's `wait_agent`)."""
    return next((t for t in tools if str(t.get("name", "")).lower() in WAIT_NAMES), None)


def fill_args(tool: dict[str, Any], given: dict[str, Any], purpose: str) -> dict[str, Any]:
    """`given` plus a plausible value for every other required parameter of the tool's schema."""
    schema = _params_schema(tool)
    args = dict(given)
    props = schema.get("properties", {}) or {}
    for name in schema.get("required", []) or []:
        if name in args:
            continue
        p = props.get(name, {}) or {}
        if p.get("enum"):
            args[name] = "LOW" if "LOW" in p["enum"] else p["enum"][0]
        elif "default" in p:
            args[name] = p["default"]
        elif p.get("type") == "boolean":
            args[name] = False
        elif p.get("type") in ("integer", "number"):
            args[name] = 120
        elif p.get("type") == "array":
            args[name] = []
        elif p.get("type") == "object":
            args[name] = {}
        else:
            args[name] = purpose
    return args


def patched_files(patch: str) -> list[str]:
    """Paths a unified diff modifies (its `+++ b/...` lines; new files included)."""
    out = []
    for line in patch.splitlines():
        if line.startswith("+++ ") and not line.startswith("+++ /dev/null"):
            path = line[4:].split("\t")[0].strip()
            out.append(path[2:] if path.startswith(("a/", "b/")) else path)
    return list(dict.fromkeys(out))


def _norm(s: str) -> str:
    return _WS.sub(" ", s).strip()


def tool_call(tool: dict[str, Any], args: dict[str, Any]) -> str:
    body = json.dumps({"name": tool["name"], "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


@dataclass
class OraclePolicy:
    """The text-level policy: prompt text in, completion text out (no tokens)."""

    tasks: dict[str, OracleTask]
    think: bool = True
    run_tests: bool = True
    read_bytes: int = 20000  # how much of each file the patch touches the inspect step prints
    delegate: bool = False  # hand the whole task to a sub-agent tool first, when one is offered
    _needles: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for t in self.tasks.values():
            self._needles[t.instance_id] = _norm(t.problem_statement)

    def identify(self, view: PromptView) -> OracleTask | None:
        """The task of this prompt: a marker first, then the whole problem statement, then
        its first 300 characters (the longest match wins); None when ambiguous or absent."""
        marks = _TASK_RE.findall(view.text)
        for m in reversed(marks):
            if m in self.tasks:
                return self.tasks[m]
        text = _norm(view.text)
        for cut in (None, 300):
            hits = [tid for tid, n in self._needles.items() if n and n[:cut] in text]
            if hits:
                return self.tasks[max(hits, key=lambda h: len(self._needles[h][:cut]))]
        return next(iter(self.tasks.values())) if len(self.tasks) == 1 else None

    @staticmethod
    def progress(view: PromptView) -> int:
        steps = [int(s) for s in _STEP_RE.findall(view.conversation)]
        return max(steps, default=0)

    def complete(self, prompt_text: str) -> str:
        view = parse_prompt(prompt_text)
        task = self.identify(view)
        done = self.progress(view)
        if view.open_assistant is not None:  # continue a prefilled assistant message: text only
            return "\n\n" + self._final_text(task, done)
        if not view.tools or any(h in view.last_user()[-2000:] for h in COMPACT_HINTS):
            if "title" in view.system[:300].lower():
                return self._title(task)
            return self._summary(task, done)
        shell = find_shell(view.tools)
        if task is None or shell is None:
            why = "I could not identify the task" if task is None else "no shell tool is available"
            return f"I cannot make progress: {why}. {MARK}:step-{STEPS}"
        step = min(done + 1, STEPS)
        sub = find_delegate(view.tools) if self.delegate and done == 0 and DELEGATED not in view.text else None
        if sub is not None:
            return self._delegate(task, sub)
        wait = find_wait(view.tools) if self.delegate and done < STEPS else None
        if wait is not None and any(r == "assistant" and DELEGATED in t for r, t in view.messages):
            return self._wait(view, task, wait)  # the parent: its sub-agent has not reported yet
        if step == STEPS:
            return self._finish(view, task, shell)
        command, say = self._command(task, step)
        args = fill_args(shell, {command_key(shell) or "command": command}, say)
        return self._think(task, step, say) + say + "\n" + tool_call(shell, args)

    # -- pieces ---------------------------------------------------------------------------
    def _think(self, task: OracleTask, step: int, say: str) -> str:
        if not self.think:
            return ""
        return f"<think>\nTask {task.instance_id}, step {step} of {STEPS}. {say}\n</think>\n\n"

    def _command(self, task: OracleTask, step: int) -> tuple[str, str]:
        tag = f"echo '{MARK}:step-{step} {MARK}:task={task.instance_id}'"
        if step == 1:
            files = " ".join(shlex.quote(f) for f in patched_files(task.patch)[:3])
            show = f" && head -c {self.read_bytes} {files}" if files and self.read_bytes > 0 else ""
            return (
                f"{tag} && git status --short && git log --oneline -3 && ls{show}",
                "Let me look at the repository and the code involved first.",
            )
        if step == 2:
            patch = task.patch if task.patch.endswith("\n") else task.patch + "\n"
            f = "${TMPDIR:-/tmp}/legorl_oracle.patch"
            return (
                f"{tag} && cat > {f} <<'{PATCH_EOF}'\n{patch}{PATCH_EOF}\n"
                f"(git apply --whitespace=nowarn {f} || patch -p1 --forward < {f}) && git diff --stat",
                "I know what causes the problem; I will apply the fix as a patch.",
            )
        files = " ".join(shlex.quote(f) for f in patched_files(task.patch)[:3])
        review = f"; git diff; head -c {self.read_bytes} {files}" if files and self.read_bytes > 0 else "; git diff"
        if not self.run_tests:
            return f"{tag}{review}", "Let me review the change."
        tests = task.test_cmd or "python3 -m pytest -q"
        return (
            f"{tag} && (timeout 300 {tests} 2>&1 | tail -n 15){review}",
            "Now I run the tests and review the changed code.",
        )

    def _finish(self, view: PromptView, task: OracleTask, shell: dict[str, Any]) -> str:
        names = {str(t.get("name")): t for t in view.tools}
        if "finish" in names:
            args = fill_args(names["finish"], {"message": self._final_text(task, STEPS)}, "done")
            return self._think(task, STEPS, "Finish.") + "The fix is in place.\n" + tool_call(names["finish"], args)
        if SUBMIT_WORD in view.system or SUBMIT_WORD in view.conversation:
            args = fill_args(shell, {command_key(shell) or "command": f"echo {SUBMIT_WORD}"}, "Submit")
            return self._think(task, STEPS, "Submit.") + "The fix is in place; submitting.\n" + tool_call(shell, args)
        return self._think(task, STEPS, "Report.") + self._final_text(task, STEPS)

    def _delegate(self, task: OracleTask, tool: dict[str, Any]) -> str:
        """Start a sub-agent (in the foreground) with the task; its report carries the
        step markers back, so the next main turn finishes."""
        prompt = f"{task.problem_statement}\n\n{MARK}:task={task.instance_id} {DELEGATED}"
        key = delegate_key(tool) or "prompt"
        given = {"description": "Fix the reported bug", key: prompt, "run_in_background": False}
        props = _params_schema(tool).get("properties", {})
        if "subagent_type" in props:  # the harness's general agent: Claude Code's or OpenCode's name for it
            blurb = json.dumps(tool)
            given["subagent_type"] = (
                "general-purpose" if "general-purpose" in blurb or "general" not in blurb else "general"
            )
        args = fill_args(tool, {k: v for k, v in given.items() if k in props}, "delegate")
        say = "I will delegate the fix to a sub-agent."
        return self._think(task, 1, say) + say + "\n" + tool_call(tool, args)

    def _wait(self, view: PromptView, task: OracleTask, tool: dict[str, Any]) -> str:
        """Wait for the sub-agent the spawn call's result named (the newest id in a tool
        result), as long as it takes."""
        ids = [m for r, t in view.messages if r in ("tool", "user") for m in _AGENT_ID_RE.findall(t)]
        props = _params_schema(tool).get("properties", {})
        given: dict[str, Any] = {"targets": ids[-1:]}
        if "timeout_ms" in props:
            given["timeout_ms"] = 3_600_000
        args = fill_args(tool, given, "wait")
        say = "I wait for the sub-agent's report."
        return self._think(task, 1, say) + say + "\n" + tool_call(tool, args)

    def _final_text(self, task: OracleTask | None, done: int) -> str:
        tid = task.instance_id if task else "unknown"
        return (
            f"I applied the fix for {tid} and checked it with the tests; the change is complete. "
            f"{MARK}:task={tid} {MARK}:step-{max(done, STEPS)}"
        )

    def _title(self, task: OracleTask | None) -> str:
        words = _norm(task.problem_statement).split(" ")[:6] if task else ["Coding", "task"]
        return "Fix: " + " ".join(words)

    def _summary(self, task: OracleTask | None, done: int) -> str:
        tid = task.instance_id if task else "unknown"
        first = _norm(task.problem_statement)[:200] if task else "unknown task"
        steps = " ".join(f"{MARK}:step-{k}" for k in range(1, done + 1)) or "none yet"
        nxt = {0: "inspect the repository", 1: "apply the fix", 2: "run the tests", 3: "finish"}.get(done, "finish")
        return (
            f"<analysis>\nThe user asked to fix task {tid}. Steps done so far: {done} of {STEPS}.\n</analysis>\n\n"
            f"<summary>\n1. Primary request: {first}\n2. Progress: {steps}\n3. Next step: {nxt}.\n"
            f"{MARK}:task={tid}\n</summary>"
        )


@dataclass(frozen=True)
class OracleOptions:
    """`[engine] options` of `kind = "oracle"`: the task file and `OracleEngine`'s switches."""

    tasks: str | None = None  # required: the task JSONL whose fixes the oracle knows
    logprob: float = 0.0
    think: bool = True
    run_tests: bool = True
    read_bytes: int = 20000
    delegate: bool = False
    latency_s: float = 0.0


class OracleEngine:
    """Engine protocol around `OraclePolicy`: decodes the prompt, encodes the answer."""

    name = "oracle"
    Options: ClassVar[type] = OracleOptions

    def __init__(
        self,
        tokenizer: Any,
        tasks: Mapping[str, OracleTask] | list[OracleTask] | str | Path,
        *,
        logprob: float = 0.0,
        think: bool = True,
        run_tests: bool = True,
        read_bytes: int = 20000,
        delegate: bool = False,
        max_context: int = 32768,
        latency_s: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.policy = OraclePolicy(
            load_oracle_tasks(tasks), think=think, run_tests=run_tests, read_bytes=read_bytes, delegate=delegate
        )
        self.logprob = float(logprob)
        self.max_context = max_context
        self.latency_s = latency_s
        self.policy_version = 0
        self.calls = 0
        self.eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    @classmethod
    def from_config(cls, cfg: Any, tokenizer: Any) -> OracleEngine:
        opts = vars(OracleOptions(**cfg.options))  # the config checked the names and types on load
        source = opts.pop("tasks")
        if source is None:
            raise ValueError("engine.options.tasks is required for engine.kind = 'oracle' (a task JSONL file)")
        return cls(tokenizer, source, max_context=cfg.max_context or 32768, **opts)

    def completion_ids(self, prompt_ids: list[int]) -> list[int]:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        answer = self.policy.complete(text)
        return self.tokenizer.encode(answer, add_special_tokens=False) + [self.eos_id]

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        check_prompt(prompt_ids, self.max_context)
        self.calls += 1
        ids = self.completion_ids(prompt_ids)
        finish = FinishReason.STOP
        if params.stop:
            ids = self._cut_at_stop(ids, params.stop)
        room = min(params.max_tokens, self.max_context - len(prompt_ids))
        if len(ids) > room:
            ids, finish = ids[:room], FinishReason.LENGTH
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        for tok in ids:
            yield TokenStep(tok, self.logprob)
        yield TokenStep(None, None, finish)

    def _cut_at_stop(self, ids: list[int], stops: tuple[str, ...]) -> list[int]:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        hits = [i + len(s) for s in stops if (i := text.find(s)) >= 0]
        if not hits:
            return ids
        end = min(hits)
        for n in range(1, len(ids) + 1):
            if len(self.tokenizer.decode(ids[:n], skip_special_tokens=False)) >= end:
                return ids[:n]
        return ids

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def update_weights(self, state_dict: Any, version: int) -> None:
        self.policy_version = int(version)

    async def close(self) -> None:
        return None


def load_oracle_tasks(source: Mapping[str, OracleTask] | list[Any] | str | Path) -> dict[str, OracleTask]:
    """Tasks from a mapping, a list (of OracleTask or legorl Task) or a task JSONL file."""
    if isinstance(source, (str, Path)):
        from legorl.tasks.loader import load_tasks

        source = load_tasks(source, check_repos=False)
    if isinstance(source, Mapping):
        items = list(source.values())
    else:
        items = list(source)
    out: dict[str, OracleTask] = {}
    for t in items:
        if isinstance(t, OracleTask):
            out[t.instance_id] = t
        elif isinstance(t, dict):
            out[t["instance_id"]] = OracleTask(
                t["instance_id"], t["problem_statement"], t["patch"], t.get("test_cmd", "")
            )
        else:  # legorl.types.Task
            out[t.instance_id] = OracleTask(t.instance_id, t.problem_statement, t.patch, getattr(t, "test_cmd", ""))
    if not out:
        raise ValueError("the oracle needs at least one task")
    return out
