"""Grading: an agent's diff judged in a fresh sandbox, by tests it never saw.

Start here: `grade.py` (`grade`, and `grade_in`: one attempt). An attempt is five stages,
each a module entered once, in order (`attempt.py` holds what they share):
1. `selection.py`: which tests run (SWE-bench's selection), by which runner (`test_command.py`:
   pytest, or Django's/SymPy's own), which paths protect them, where the canaries go;
2. `prepare.py`: the diff's size, its protected sections dropped (`protect.py`, `patch.py`),
   the grader's work directory;
3. `apply.py`: the diff applied, every protected path put back by the tree, the task's tests;
4. `execute.py`: the supervised run (`pytest_plan.py` + `in_sandbox/pytest_main.py`, or `native.py` +
   `in_sandbox/native_main.py`: these mains and the `lg_*` modules beside them run inside the
   sandbox under the image's Python);
5. `judge.py`: the channels that must agree (`verdict.py`: `junit.py`'s report, the
   recorder's records and the canaries; `native.py` for the native runners) → the Outcome.
`grade` wraps one attempt of any task kind (`legorl/tasks/kinds/`: the kind says how it is
graded): Harbor tasks are graded by their verifier's reward instead (`state_grade.py`, `state.py`).
"""
