"""The trainer: GSPO (and GRPO, Dr.GRPO) on recorded token ids, with routing replay.

Public entry points (import from the modules; this package imports nothing on its own):

- `trainer.Trainer(cfg, lm=None, weight_sync=None)`: `step(trajectories, data_state=None)`
  → metrics; `await train_step(...)` = step + `await sync_weights()`; `save_checkpoint()`,
  `load_checkpoint(path_or_dir)`; `version`, `step_count`, `data_state`.
- `config.TrainerConfig`: the `[trainer]` section.
- `sync.InProcessSync(engine)`, `sync.DiskSync([engines], dir)`: the `WeightSync` protocol.
- `losses` (pure functions), `advantages.compute_advantages`, `mismatch` (metrics, TIS/MIS),
  `routing.moe_routing` (R3 capture/replay), `logprobs.PolicyModel` (recompute),
  `batch.pack` (trajectories → packed micro-batches), `checkpoint`, `fsdp`, `varlen`.
- `sampler.sample`: reference KV-cache sampler; `minimal`: the whole loop in one file.
"""
