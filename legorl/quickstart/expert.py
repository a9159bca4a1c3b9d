"""The scripted expert whose episodes are the SFT data — right only part of the time.

It always works the same way: run the tests, then rewrite one line of calc.py with `sed`
and submit in the same command. Which line it rewrites is where it is imperfect: with
probability `p_read` it reads the output properly and fixes the function whose test says
FAIL; otherwise it follows a plausible but wrong habit — it fixes the function of the
first test the output mentions — which is right only when that test is the failing one.
Every rewrite it makes is a correct body for the function it picked, so the
demonstrations teach the commands, the names and each name's operator exactly, and the
choice of function mostly from the wrong cue.

That gap is deliberate (issue 7): with perfect demonstrations there is nothing left that
RL can teach faster than more SFT. Here SFT converges to the expert's own success rate,
p_read + (1 - p_read) / k for k functions; only the reward — the grader's test run — says
which choice was right.

The wrong habit is `habit = "first"` by default, and it stays the policy's most likely
choice, so greedy decoding does not escape it either. `habit = "guess"` replaces it with a
guess: a function drawn uniformly from those the output lists. The success rate is the same,
but the choice stays uncertain, so the samples of one group disagree about which function to
fix. A converged SFT on `first` is near-deterministic per task. When another function is
listed before the failing one, it names the failing one in only 9–22% of rollouts, and 71% of
GSPO's groups had identical rewards (docs/measured.md, mixed run 11). The spread survives
SFT only when each task is shown several times (`[warm_start] distinct_tasks`), each a fresh
draw. Shown once, a guess is memorised as one pick per task just as surely (Claude Code run
12), and RL needs the spread to learn from. Greedy decoding
reads under `guess`, since the failing function is its most likely choice, but held-out
evaluation samples at the policy's temperature. GSPO can learn to read the FAIL line; imitation
of this expert cannot.

`ExpertEngine` puts the expert behind the proxy as an engine: it reads the prompt ids the
proxy rendered (the harness's conversation), decides from the last observation alone, and
answers with token ids — so the SFT data is exactly what the proxy recorded from a real
harness run.

It acts through whatever the harness offers. mini-swe-agent's text agent gets a fenced
command (submit echo included). A tool-calling harness (Claude Code, OpenCode, OpenHands,
Codex: a prompt whose system block lists tools) gets the same decision as a call of *that
harness's own shell tool* in the policy's chat template (`<tool_call>{"name": "Bash", ...}`),
which the proxy parses into the harness's dialect exactly as it would a model's; after the
fix it finishes the harness's way (OpenHands' `finish` tool, else a final text answer), and
answers the harness's side calls (titles, compaction summaries) with short plain text.
"""

from __future__ import annotations

import collections
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from legorl.engine.base import collect
from legorl.engine.oracle import COMPACT_HINTS, PromptView, command_key, fill_args, find_shell, parse_prompt, tool_call
from legorl.quickstart.family import POOL, SOURCE_FILE, TEST_CMD, line
from legorl.types import FinishReason, Generation, SamplingParams, TokenStep

FENCE = "```mswea_bash_command\n{}\n```"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_FAILING = re.compile(r"^FAIL (\w+):", re.MULTILINE)
_FIRST = re.compile(r"^(?:PASS|FAIL) (\w+)", re.MULTILINE)
_LINE = re.compile(r"^(?:PASS|FAIL) .*$", re.MULTILINE)


def fix_command(name: str) -> str:
    """Rewrite the line defining `name` with its correct body, and submit. The `|`
    delimiter keeps `a // b` (div) from ending the `s` command early."""
    return f"sed -i 's|^def {name}.*|{line(name, POOL[name])}|' {SOURCE_FILE} && {SUBMIT}"


_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # a terminal tool's control sequences (OpenHands' bracketed paste)


def plain(observation: str) -> str:
    """The observation as the test printed it: terminal control sequences removed."""
    return _ESCAPE.sub("", observation)


def failing_function(observation: str) -> str | None:
    m = _FAILING.search(plain(observation))
    return m.group(1) if m and m.group(1) in POOL else None


def first_function(observation: str) -> str | None:
    m = _FIRST.search(plain(observation))
    return m.group(1) if m and m.group(1) in POOL else None


def test_lines(observation: str | None) -> str:
    """The PASS/FAIL lines of an observation: what the expert's choice depends on."""
    return "\n".join(m.group(0) for m in _LINE.finditer(plain(observation or "")))


def expert_draw(seed: int, observation: str | None, visit: int = 0) -> float:
    """The expert's uniform draw for the `visit`-th time it chooses on these test lines: a
    pure function of the seed, the lines and the visit. The demonstrations of one task then
    differ from each other, but as a set they do not depend on the order in which concurrent
    harness sessions reach the engine (and both paths draw alike for one task)."""
    lines = test_lines(observation)
    return random.Random(f"{seed}:{lines}" + (f":{visit}" if visit else "")).random()


HABITS = ("first", "guess")


def listed_functions(observation: str) -> list[str]:
    """The functions the test output names, in the order it lists them (each once)."""
    names = [m.group(1) for m in _FIRST.finditer(plain(observation))]
    return [n for i, n in enumerate(names) if n in POOL and n not in names[:i]]


def choose(observation: str, failing: str, draw: float, p_read: float, habit: str = "first") -> str:
    """Which function the expert fixes: the failing one when draw < p_read; otherwise its
    habit's pick, the first listed (`first`) or one drawn uniformly from the listed by the
    rest of the same draw (`guess`), so the choice stays a pure function of the draw."""
    if draw < p_read:
        return failing
    listed = listed_functions(observation)
    if not listed:
        return failing
    if habit == "guess":
        u = (draw - p_read) / (1.0 - p_read)  # uniform in [0, 1) given draw >= p_read
        return listed[min(int(u * len(listed)), len(listed) - 1)]
    return listed[0]


def expert_reply(observation: str | None, draw: float, p_read: float, habit: str = "first") -> str:
    """The expert's next message given the last observation (None before the first turn)
    and a uniform draw in [0, 1): run the tests until their output names a failing
    function, then fix the function `choose` picks."""
    failing = failing_function(observation or "")
    if failing is None:
        return FENCE.format(TEST_CMD)
    return FENCE.format(fix_command(choose(observation or "", failing, draw, p_read, habit)))


DONE = "I fixed calc.py; the tests pass."
PROBLEM_ECHO = "the tests of calc.py were run and one function was rewritten."  # a compaction summary


def tool_reply(view: PromptView, draw: float, p_read: float, habit: str = "first") -> str:
    """The same expert through a tool-calling harness: run the tests with its shell tool,
    then rewrite the chosen line with it, then finish the harness's way. The phase is read
    from the conversation (an earlier `sed -i` call means the fix was made), the choice from
    the last observation, so the reply is a pure function of the prompt."""
    if view.open_assistant is not None:  # a prefilled assistant message (OpenCode's last step)
        return DONE
    if not view.tools or any(h in view.last_user()[-2000:] for h in COMPACT_HINTS):
        return "Fix calc.py" if "title" in view.system[:300].lower() else f"Summary: {PROBLEM_ECHO}"
    shell = find_shell(view.tools)
    if shell is None:
        return "I cannot run commands here."
    key = command_key(shell) or "command"
    if any(role == "assistant" and "sed -i" in text for role, text in view.messages):
        names = {str(t.get("name")): t for t in view.tools}
        if "finish" in names:
            return tool_call(names["finish"], fill_args(names["finish"], {"message": DONE}, "done"))
        return DONE
    observation = view.last_user()
    failing = failing_function(observation)
    if failing is None:
        return tool_call(shell, fill_args(shell, {key: TEST_CMD}, "Run the tests"))
    name = choose(observation, failing, draw, p_read, habit)
    command = f"sed -i 's|^def {name}.*|{line(name, POOL[name])}|' {SOURCE_FILE}"
    return tool_call(shell, fill_args(shell, {key: command}, "Fix calc.py"))


@dataclass(frozen=True)
class ExpertOptions:
    """`[engine] options` of `kind = "quickstart-expert"`."""

    p_read: Annotated[float, Field(ge=0.0, le=1.0)] = 0.3  # chance of reading the failing test first
    habit: Literal["first", "guess"] = "first"  # the choice when not reading: the first listed, or a uniform guess


class ExpertEngine:
    """The expert as an Engine: prompt ids in, the expert's reply as token ids out.

    The observation it reacts to is the text of the last user message in the prompt
    (decoded from the ids the proxy rendered); a prompt whose last message is the task
    statement gets the test command. Logprobs are 0.0: the expert is not a policy whose
    probabilities anyone trains against."""

    name = "expert"
    Options: ClassVar[type] = ExpertOptions

    def __init__(self, tokenizer: Any, p_read: float, seed: int = 0, habit: str = "first") -> None:
        if not 0.0 <= p_read <= 1.0:
            raise ValueError(f"p_read must be in [0, 1], got {p_read}")
        if habit not in HABITS:
            raise ValueError(f"habit must be one of {', '.join(HABITS)}, got {habit!r}")
        self.habit = habit
        self.tokenizer = tokenizer
        self.p_read = p_read
        self.seed = seed
        self.policy_version = 0
        self.max_context = 2**31  # the expert reads only the last message
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.calls = 0
        self._visits: collections.Counter[str] = collections.Counter()  # fixes made per test lines

    @classmethod
    def from_config(cls, cfg: Any, tokenizer: Any) -> ExpertEngine:
        """From `[engine] kind = "quickstart-expert"`, `options = {p_read = 0.3, habit = "first"}`, `seed`."""
        opts = ExpertOptions(**cfg.options)  # the config checked the names and types on load
        return cls(tokenizer, float(opts.p_read), seed=int(cfg.seed or 0), habit=opts.habit)

    def observation_of(self, prompt_ids: list[int]) -> tuple[PromptView | None, str]:
        """The prompt parsed (None for a text agent's prompt) and its last user message."""
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        view = parse_prompt(text)
        if view.tools:  # a tool-calling harness: the expert acts through its shell tool
            return view, view.last_user()
        return None, text.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]

    def reply_for(self, prompt_ids: list[int], visit: int = 0) -> str:
        """The reply to a prompt, the `visit`-th time the expert chooses on its test lines."""
        return self._reply(*self.observation_of(prompt_ids), visit)

    def _reply(self, view: PromptView | None, last: str, visit: int) -> str:
        draw = expert_draw(self.seed, last, visit)
        if view is not None:
            return tool_reply(view, draw, self.p_read, self.habit)
        return expert_reply(last, draw, self.p_read, self.habit)

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenStep]:
        """Demonstrations that repeat a task (`[warm_start] distinct_tasks`) each get a new
        draw for its choice: every fix made on the same test lines counts one visit. Imitation
        then meets the expert's spread on one observation, not one arbitrary pick per
        observation that SFT could memorise."""
        self.calls += 1
        view, last = self.observation_of(prompt_ids)
        key = test_lines(last)
        reply = self._reply(view, last, self._visits[key])
        if key and "sed -i" in reply:
            self._visits[key] += 1
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.im_end]
        finish = FinishReason.STOP
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], FinishReason.LENGTH
        for tok in ids:
            yield TokenStep(tok, 0.0)
        yield TokenStep(None, None, finish)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return await collect(self.stream(prompt_ids, params), len(prompt_ids))

    async def close(self) -> None:
        return None
