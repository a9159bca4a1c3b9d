"""The scripted expert whose episodes are the SFT data — right only part of the time.

It always works the same way: run the tests, then rewrite one line of calc.py with `sed`
and submit in the same command. Which line it rewrites is where it is imperfect: with
probability `p_read` it reads the output properly and fixes the function whose test says
FAIL; otherwise it follows a plausible but wrong habit — it fixes the function of the
first test the output mentions — which is right only when that test is the failing one.
Every rewrite it makes is a correct body for the function it picked, so the demonstrations
teach the commands, the names and each name's operator exactly, and the choice of
function mostly from the wrong cue.

That gap is deliberate (issue 7): with perfect demonstrations there is nothing left that
RL can teach faster than more SFT. Here SFT converges to the expert's own success rate,
p_read + (1 - p_read) / k for k functions, and the habit stays the policy's most likely
choice (so greedy decoding does not escape it either); only the reward — the grader's
test run — says which choice was right. GSPO can learn to read the FAIL line; imitation
of this expert cannot.
"""

from __future__ import annotations

import random
import re

from legorl.quickstart.family import POOL, SOURCE_FILE, TEST_CMD, QuickTask, line

FENCE = "```mswea_bash_command\n{}\n```"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_FAILING = re.compile(r"^FAIL (\w+):", re.M)
_FIRST = re.compile(r"^(?:PASS|FAIL) (\w+)", re.M)


def fix_command(name: str) -> str:
    """Rewrite the line defining `name` with its correct body, and submit."""
    return f"sed -i 's/^def {name}.*/{line(name, POOL[name])}/' {SOURCE_FILE} && {SUBMIT}"


def failing_function(observation: str) -> str | None:
    m = _FAILING.search(observation)
    return m.group(1) if m else None


def first_function(observation: str) -> str | None:
    m = _FIRST.search(observation)
    return m.group(1) if m else None


class Expert:
    """Replies of the scripted expert for one episode (stateful: which turn it is on)."""

    def __init__(self, task: QuickTask, rng: random.Random, p_read: float) -> None:
        self.task = task
        self.rng = rng
        self.p_read = p_read
        self.turn = 0
        self.read_output = False  # whether this episode's fix came from the test output

    def reply(self, observation: str | None) -> str:
        """The assistant message for the next turn, given the last observation."""
        self.turn += 1
        if self.turn == 1:
            return FENCE.format(TEST_CMD)
        failing, first = failing_function(observation or ""), first_function(observation or "")
        if failing is not None and (first is None or self.rng.random() < self.p_read):
            self.read_output, name = True, failing
        else:
            name = first or self.rng.choice(self.task.names)
        return FENCE.format(fix_command(name))
