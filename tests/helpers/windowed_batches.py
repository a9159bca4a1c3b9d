"""Batches and models for the trainer's sharing and trimming tests: harness-shaped
trajectories (a long shared system prompt, per-task statements, each rollout's own turns) and
tiny windowed Qwen3 policies (tests/train/test_train_shared_prefix.py,
test_train_receptive_field.py, tests/bench/test_bench_receptive_trim.py)."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from legorl.model_families import build
from legorl.train import varlen
from legorl.train.logprobs import PolicyModel
from legorl.types import AlignmentStats, Segment, Trajectory


def harness_shaped(g: torch.Generator, vocab: int, routing: tuple[int, int, int] | None = None) -> list[Trajectory]:
    """Two tasks of three rollouts each, and one lone trajectory. With `routing` (MoE layers,
    top-k, experts) each segment carries recorded experts as an engine with a prefix cache
    records them: one routing for the shared system prompt, one per task statement."""

    def experts(n: int) -> list[list[list[int]]]:
        layers, k, e = routing  # type: ignore[misc]
        return torch.rand(n, layers, e, generator=g).argsort(-1)[..., :k].tolist()

    system = torch.randint(3, vocab, (120,), generator=g).tolist()
    system_r = experts(120) if routing else []
    trajs = []
    for task in range(2):
        statement = torch.randint(3, vocab, (40 + task,), generator=g).tolist()  # > MIN_SHARE: a second level
        statement_r = experts(len(statement)) if routing else []
        for k in range(3):
            turn = torch.randint(3, vocab, (15 + 4 * k,), generator=g).tolist()
            obs = torch.randint(3, vocab, (10,), generator=g).tolist()
            last = torch.randint(3, vocab, (7 + k,), generator=g).tolist()
            ids = system + statement + turn + obs + last
            mask = [0] * len(system + statement) + [1] * len(turn) + [0] * len(obs) + [1] * len(last)
            lps = [-1.0 * m for m in mask]
            seg = Segment([0, 1], ids, mask, lps, [0, 0])
            if routing:
                seg.routed_experts = system_r + statement_r + experts(len(ids) - len(system + statement))
            trajs.append(Trajectory(f"t{task}-{k}", [seg], AlignmentStats(), instance_id=f"x{task}"))
    alone = torch.randint(3, vocab, (60,), generator=g).tolist()
    seg = Segment([0], alone, [0] * 40 + [1] * 20, [0.0] * 40 + [-1.0] * 20, [0])
    if routing:
        seg.routed_experts = experts(60)
    trajs.append(Trajectory("alone", [seg], AlignmentStats()))
    return trajs


def windowed_qwen3(layer_types: list[str], window: int = 8, attention: str | None = None) -> PolicyModel:
    """A tiny random-init Qwen3 whose layers are `layer_types`; sliding ones see `window` tokens back."""
    cfg = build("qwen3").config.to_dict()
    cfg.update(use_sliding_window=True, sliding_window=window, layer_types=layer_types)
    cfg["num_hidden_layers"] = len(layer_types)
    torch.manual_seed(0)
    lm = Qwen3ForCausalLM(Qwen3Config(**cfg)).float()
    lm.set_attn_implementation(attention or varlen.register())
    return PolicyModel(lm)
