"""Task generation: real projects with injected bugs that their own tests catch.

Start here: `build.py` (`generate`: unpack a project, find its stable tests, keep the
mutants that fail some of them, write SWE-bench instances and one git bundle). Its parts:
`projects.py` (the projects and how to test each), `mutate.py` (AST bug injection),
`labels.py` (the hardened test run that labels FAIL_TO_PASS / PASS_TO_PASS), `hide.py`
(the agent's view without the failing tests) and `problem.py` (the issue text).
`native.py` does the same for projects with their own runner (Django, SymPy).
"""
