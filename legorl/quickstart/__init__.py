"""The quickstart's task family and demonstrator — data and an engine, not a loop.

`legorl train examples/quickstart.toml` runs the one loop (legorl/loop/train.py) on:
- `family.py`: the calc task family (three one-line functions, one broken);
- `source.py`: that family as SWE-bench-format tasks with a git repository
  (`[run] tasks = "quickstart-calc"`, sized by `[calc_tasks]`), graded by legorl.verify;
- `expert.py`: the scripted demonstrator as an engine (`[warm_start.engine] kind =
  "quickstart-expert"`), imperfect on purpose;
- `mini_quickstart.yaml`: the compact mini-swe-agent config the harness runs with.
"""
