"""FSDP2 data parallelism: 2 CPU processes (torchrun, gloo) compute the same gradients and the
same update as 1 process over the whole batch, dense and MoE (with routing replay); a sharded
checkpoint (gathered, saved, loaded into a fresh sharded trainer) continues identically.

This file is also the worker: torchrun runs it as a script (`__main__` below)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

MODELS = ("tiny-qwen3", "tiny-qwen3-moe")


def batch(model: str):
    """Deterministic multi-segment trajectories in 3 groups; MoE ones carry a replay."""
    from legorl.types import AlignmentStats, Outcome, Segment, Status, Trajectory

    g = torch.Generator().manual_seed(0)
    trajs = []
    for i, n in enumerate([40, 23, 31, 12, 50, 27, 18, 35]):
        segs = []
        for s, length in enumerate((n, n // 2 + 3)):
            ids = torch.randint(3, 4096, (length,), generator=g).tolist()
            mask = [0] * 5 + [int(x) for x in (torch.rand(length - 5, generator=g) > 0.3).tolist()]
            lps = [(-3.0 * float(torch.rand(1, generator=g))) if m else 0.0 for m in mask]
            routing = None
            if model.endswith("moe"):
                routing = (
                    torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(length * 4)])
                    .view(length, 4, 2)
                    .tolist()
                )
            segs.append(Segment([s], ids, mask, lps, [0], routing))
        reward = float(torch.rand(1, generator=g))
        trajs.append(
            Trajectory(
                f"t{i}", segs, AlignmentStats(), instance_id=f"task{i % 3}", outcome=Outcome(reward, Status.FAILED)
            )
        )
    return trajs


def worker(out_dir: str) -> None:
    import torch.distributed as dist

    from legorl.train.config import TrainerConfig
    from legorl.train.trainer import Trainer

    torch.set_num_threads(1)
    results = {}
    for model in MODELS:
        cfg = TrainerConfig(
            model=model, lr=1e-2, max_grad_norm=1.0, max_tokens_per_microbatch=90, seed=0, loss="gspo", correction="tis"
        )
        trainer = Trainer(cfg)
        grads = {}

        def keep(*_: object) -> None:  # the step frees its gradients after AdamW: read them just before
            for name, p in trainer.policy.named_parameters():
                grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                grads[name] = grad.detach().cpu().clone()

        hook = trainer.optimizer.register_step_pre_hook(keep)
        metrics = trainer.step(batch(model))
        hook.remove()
        params = trainer.state_dict_for_engines()
        resumed_equal = None
        if dist.is_initialized():  # sharded checkpoint round trip: the next step is identical
            path = trainer.save_checkpoint(Path(out_dir) / f"ckpt-{model}")
            again = Trainer(cfg)
            again.load_checkpoint(path)
            trainer.step(batch(model))
            again.step(batch(model))
            a, b = trainer.state_dict_for_engines(), again.state_dict_for_engines()
            resumed_equal = all(torch.equal(a[k], b[k]) for k in a) and again.step_count == trainer.step_count
        results[model] = (metrics, grads, params, resumed_equal)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        torch.save(results, Path(out_dir) / f"world{dist.get_world_size() if dist.is_initialized() else 1}.pt")
    if dist.is_initialized():
        dist.barrier()  # both ranks done before the group goes (a rank leaving first can abort gloo's threads)
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    here = str(Path(__file__).resolve())
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    subprocess.run([sys.executable, here, str(tmp_path)], check=True, env=env, timeout=600, capture_output=True)
    proc = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", here, str(tmp_path)],
        env=env,
        timeout=600,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = torch.load(tmp_path / "world1.pt", weights_only=False)
    two = torch.load(tmp_path / "world2.pt", weights_only=False)
    for model in MODELS:
        m1, g1, p1, _ = one[model]
        m2, g2, p2, resumed_equal = two[model]
        assert resumed_equal is True, f"{model}: FSDP checkpoint resume diverged"
        assert g1.keys() == g2.keys() and p1.keys() == p2.keys()
        for k in g1:
            torch.testing.assert_close(g2[k], g1[k], rtol=1e-4, atol=1e-7, msg=f"{model} grad {k}")
        for k in p1:
            torch.testing.assert_close(p2[k], p1[k], rtol=1e-5, atol=1e-6, msg=f"{model} param {k}")
        for key in ("train/loss", "train/grad_norm", "mismatch/k3_kl", "train/entropy", "train/sampled_tokens"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-8), (model, key)
        assert m1["train/grad_norm"] > 0
        if model.endswith("moe"):
            assert m2["mismatch/routing_mismatch"] == m1["mismatch/routing_mismatch"] == 0.0


if __name__ == "__main__":
    worker(sys.argv[1])
