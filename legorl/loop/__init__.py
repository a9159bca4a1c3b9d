"""The whole loop: rollout workers, `legorl train`, `legorl eval`, and the Ray backend.

Start here: `train.py` (`legorl train`: sample tasks → groups of rollouts → run store →
GSPO → weight sync), then `worker.py` (`RolloutWorker`: one rollout with its retries, from
task image to graded trajectory). `config.py` is the run config (one section per
component); `warm_start.py`, `heldout.py` and `report.py` + `stats.py` are the quickstart's
phases and its before/after table; `evaluate.py` (+ `official_report.py`) is `legorl eval`;
`rollout_cli.py` is `legorl rollout`; `preflight.py` runs `legorl doctor`'s checks (each registered by its component);
`ray_backend.py` spreads rollouts over Ray actors; `metrics.py` and `errors.py` are small
shared pieces. For the loop in one readable file, see `legorl/train/minimal.py`.
"""
