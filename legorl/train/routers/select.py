"""What every router adapter shares: the replayed selection and the result type."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Routed(NamedTuple):
    outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # what the router returns: (logits, weights, indices)
    natural_N_K: torch.Tensor  # the experts the router itself chose


def replayed(natural_N_K: torch.Tensor, replay_N_K: torch.Tensor | None) -> torch.Tensor:
    """The experts to use: the replayed ones, except rows recorded as -1 (the router decides)."""
    if replay_N_K is None:
        return natural_N_K
    if replay_N_K.shape[0] != natural_N_K.shape[0]:
        raise RuntimeError(
            f"routing replay has {replay_N_K.shape[0]} token rows but the layer sees {natural_N_K.shape[0]} tokens"
        )
    known_N_1 = (replay_N_K >= 0).all(dim=-1, keepdim=True)
    return torch.where(known_N_1, replay_N_K.to(natural_N_K.device, natural_N_K.dtype), natural_N_K)
