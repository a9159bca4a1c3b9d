"""Grading: an agent's diff judged in a fresh sandbox, by tests it never saw.

Start here: `grade.py` (`grade_in`: the last stage of a rollout, its steps in its
docstring). It uses `protect.py` and `patch.py` (which paths the diff may not change),
`selection.py` (which tests run, as SWE-bench selects them), `runners.py` (which runner a
task's command names) and `runner.py` (the hardened pytest invocation), and decides with
`verdict.py` (three channels that must agree: `junit.py`'s report, the recorder's records
and the canaries). `_supervisor.py` and `_native_supervisor.py` run inside the sandbox
under the image's Python; `native.py` plans and judges Django's and SymPy's own runners.
"""
