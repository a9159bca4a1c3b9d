"""Tasks: SWE-bench-format problems, loaded, checked and turned into sandbox images.

Start here: `loader.py` (`load_tasks`: JSONL → `legorl.types.Task`, every bad field reported
with its line), then `image.py` (`TaskImages`: a task → its cached image). `official.py` is
what the official `swebench` package defines as we use it (parsers, eval scripts),
`prebuilt.py` imports a task's own Docker image, `validate.py` is the oracle check behind
`legorl tasks validate` (gold patch resolves, empty patch does not), and `cli.py` is
`legorl tasks ...`. `generator/` makes new tasks by bug injection. `family.py` maps SWE-smith,
R2E-Gym and SWE-rebench rows to these fields. Harbor task directories: `harbor.py` (task.toml
+ instruction.md → a Task of kind "harbor"), `dockerfile.py` (the Dockerfile subset),
`harbor_image.py` (built into the image cache), `harbor_validate.py` (solve.sh scores 1,
doing nothing 0); they are state-graded by `legorl/verify/state_grade.py`.
"""
