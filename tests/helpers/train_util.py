"""A few real trajectories for trainer tests: sampled from a model by the minimal loop's own
rollouts (legorl/train/minimal.py), so a test trains on what a policy produced
(tests/train/test_memory_flat.py, test_train_fresh_moments.py)."""

from __future__ import annotations

import torch

from legorl.train import minimal


def toy_trajectories(lm: torch.nn.Module, n: int = 4, prompts: int = 1) -> list:
    import argparse

    args = argparse.Namespace(
        prompts_per_step=prompts, group_size=n, prompt_len=8, new_tokens=8, target_tokens=256, seed=0
    )
    trajs, _ = minimal.rollouts(lm, 0, args)
    return trajs
