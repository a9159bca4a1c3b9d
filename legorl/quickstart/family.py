"""The quickstart's task family: one-line arithmetic functions, one of them broken.

Each task is a two-file Python repository: `calc.py` defines `k` functions drawn from a
pool of eight (`add`, `sub`, ...), one per line, one of them with a wrong operator; and
`test_calc.py` checks every function, in file order, and prints one line per test
(`PASS add`, `FAIL mul: got 9, expected 18`, ...). The problem statement does not say which
function is broken: the fix has to be read from the failing test's output. That is the
skill the RL phase teaches — the scripted expert that produces the SFT data reads the
test output only part of the time (see expert.py), so the demonstrations show the fix's
format but not reliably where it goes.

Tasks are plain data (`QuickTask`); `to_task` turns one into the SWE-bench-format
`legorl.types.Task` (problem statement, gold patch, FAIL_TO_PASS, test command) so it can
be stored and shown like any other task. Train and held-out tasks come from disjoint seed
ranges and are checked disjoint on their content (`split_is_disjoint`).
"""

from __future__ import annotations

import difflib
import hashlib
import random
from dataclasses import dataclass

from legorl.types import Task

# name -> the operator its one-line body must use
POOL: dict[str, str] = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "//",
    "mod": "%",
    "pow": "**",
    "xor": "^",
    "shl": "<<",
}
TEST_FILE = "test_calc.py"
SOURCE_FILE = "calc.py"
TEST_CMD = f"python3 {TEST_FILE}"  # what the agent runs: PASS/FAIL lines
GRADE_CMD = f"pytest -q {TEST_FILE}"  # what grading runs (legorl.verify: pytest, tests restored)
PROBLEM = "A test in test_calc.py fails. Fix calc.py."

_TEST_HEAD = """import calc

CASES = {cases}


def call(name, a, b):
    try:
        return getattr(calc, name)(a, b)
    except Exception as e:
        return type(e).__name__

"""
_TEST_FN = """
def test_{name}():
    assert call({name!r}, {a}, {b}) == {want!r}
"""
_TEST_MAIN = """

if __name__ == "__main__":
    failed = 0
    for name, a, b, want in CASES:
        got = call(name, a, b)
        if got == want:
            print(f"PASS {name}")
        else:
            failed += 1
            print(f"FAIL {name}: got {got}, expected {want}")
    raise SystemExit(1 if failed else 0)
"""


def line(name: str, op: str) -> str:
    return f"def {name}(a, b): return a {op} b"


def apply_op(op: str, a: int, b: int) -> int:
    return {
        "+": a + b,
        "-": a - b,
        "*": a * b,
        "//": a // b,
        "%": a % b,
        "**": a**b,
        "^": a ^ b,
        "<<": a << b,
    }[op]


@dataclass(frozen=True)
class QuickTask:
    """One generated repository: which functions, which one is broken and how."""

    instance_id: str
    names: tuple[str, ...]  # functions in calc.py, in file order
    buggy: str  # the broken function
    wrong_op: str  # the operator it uses instead of POOL[buggy]
    cases: tuple[tuple[str, int, int], ...]  # (function, a, b) checked by the test

    def source(self, fixed: bool = False) -> str:
        ops = {n: POOL[n] for n in self.names}
        if not fixed:
            ops[self.buggy] = self.wrong_op
        return "".join(line(n, ops[n]) + "\n" for n in self.names)

    def test_script(self) -> str:
        """`test_calc.py`: one pytest test per function (what grading runs) that also runs
        as a script printing `PASS add` / `FAIL mul: got 9, expected 18` (what the agent
        runs: the observation it has to read)."""
        cases = [(n, a, b, apply_op(POOL[n], a, b)) for n, a, b in self.cases]
        fns = "".join(_TEST_FN.format(name=n, a=a, b=b, want=w) for n, a, b, w in cases)
        return _TEST_HEAD.format(cases=repr(cases)) + fns + _TEST_MAIN

    def files(self) -> dict[str, str]:
        return {SOURCE_FILE: self.source(), TEST_FILE: self.test_script()}

    def gold_patch(self) -> str:
        diff = difflib.unified_diff(
            self.source().splitlines(keepends=True),
            self.source(fixed=True).splitlines(keepends=True),
            f"a/{SOURCE_FILE}",
            f"b/{SOURCE_FILE}",
        )
        return f"diff --git a/{SOURCE_FILE} b/{SOURCE_FILE}\n" + "".join(diff)

    def to_task(self, split: str) -> Task:
        return Task(
            instance_id=self.instance_id,
            repo="legorl/quickstart-calc",
            base_commit="",
            problem_statement=PROBLEM,
            patch=self.gold_patch(),
            test_patch="",
            FAIL_TO_PASS=[f"{TEST_FILE}::test_{self.buggy}"],
            PASS_TO_PASS=[f"{TEST_FILE}::test_{n}" for n in self.names if n != self.buggy],
            test_cmd=GRADE_CMD,
            split=split,
        )


def _distinguishing(name: str, wrong: str, rng: random.Random) -> tuple[int, int]:
    """Arguments on which the right and the wrong operator disagree (and stay small)."""
    for _ in range(100):
        a, b = rng.randint(2, 9), rng.randint(1, 4)
        try:
            if apply_op(POOL[name], a, b) != apply_op(wrong, a, b):
                return a, b
        except ZeroDivisionError:
            continue
    raise RuntimeError(f"no distinguishing input for {name} vs {wrong}")


def make_task(seed: int, k: int = 4) -> QuickTask:
    """The task of one seed: k distinct functions, one broken with another pool operator."""
    rng = random.Random(seed)
    names = tuple(rng.sample(sorted(POOL), k))
    buggy = rng.choice(names)
    wrong = rng.choice([op for op in sorted(set(POOL.values())) if op != POOL[buggy]])
    cases = []
    for n in names:
        a, b = _distinguishing(n, wrong, rng) if n == buggy else (rng.randint(2, 9), rng.randint(1, 4))
        cases.append((n, a, b))
    digest = hashlib.sha1(repr((names, buggy, wrong, cases)).encode()).hexdigest()[:8]
    return QuickTask(f"calc-{seed}-{digest}", names, buggy, wrong, tuple(cases))


TRAIN_SEED0, HELDOUT_SEED0 = 0, 1_000_000


def split_of(t: QuickTask) -> str:
    """Held-out iff a hash of (functions in order, broken one, wrong operator) is 0 mod 5.

    So no held-out repository has the same calc.py as any training repository, whatever
    the number of tasks drawn; what transfers is the skill, not a memorised file.
    """
    key = repr((t.names, t.buggy, t.wrong_op)).encode()
    return "heldout" if int(hashlib.sha1(key).hexdigest(), 16) % 5 == 0 else "train"


def tasks(split: str, n: int, k: int = 4) -> list[QuickTask]:
    """`n` tasks of a split: `train` (SFT and RL) or `heldout` (evaluation only)."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    seed = TRAIN_SEED0 if split == "train" else HELDOUT_SEED0
    out: list[QuickTask] = []
    while len(out) < n:
        t = make_task(seed, k)
        if split_of(t) == split:
            out.append(t)
        seed += 1
    return out


def run_tests_in_process(task: QuickTask, source: str) -> tuple[str, int]:
    """(output, exit code) of the task's test script against `source` as calc.py, run by
    exec in this process (no subprocess): for building corpora and for unit tests. The
    episodes themselves run the script for real in their sandbox."""
    import contextlib
    import io
    import types

    module = types.ModuleType("calc")
    buf = io.StringIO()
    code = 0
    try:
        exec(compile(source, SOURCE_FILE, "exec"), module.__dict__)  # noqa: S102 - the point: run calc.py
    except Exception as e:  # noqa: BLE001 - any error of a broken calc.py is what its import would raise
        return f"{type(e).__name__}: {e}\n", 1
    script = task.test_script().replace("import calc\n", "", 1)
    with contextlib.redirect_stdout(buf):
        try:
            exec(compile(script, TEST_FILE, "exec"), {"calc": module, "__name__": "__main__"})  # noqa: S102
        except SystemExit as e:
            code = int(e.code or 0)
    return buf.getvalue(), code
