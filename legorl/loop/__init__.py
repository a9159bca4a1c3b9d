"""The whole loop: rollout workers, `legorl train`, `legorl eval`, and the Ray backend."""
