"""Tasks: SWE-bench-format problems, loaded, checked and turned into sandbox images.

Start here: `loader.py` (`load_tasks`: JSONL → `legorl.types.Task`, every bad field reported
with its line), then `image.py` (`TaskImages`: a task → its cached image). `official.py` is
what the official `swebench` package defines as we use it (parsers, eval scripts),
`prebuilt.py` imports a task's own Docker image, `validate.py` is the oracle check behind
`legorl tasks validate` (gold patch resolves, empty patch does not), and `cli.py` is
`legorl tasks ...`. `generator/` makes new tasks by bug injection.
"""
