"""Memory that stays flat (issue 37, item 5): what bounds a run's resident memory, and what
reports it. Sizes here are counts and byte estimates, never timings or machine-dependent peaks."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from legorl.engine.kv_prefix import Prefix, PrefixStore
from legorl.loop import memory
from legorl.loop.report import Report
from legorl.train.activations import activation_bytes_per_token, wants_checkpointing
from legorl.train.batch import pack
from legorl.train.config import TrainerConfig
from legorl.train.sft import SFTConfig, sft
from legorl.train.trainer import Trainer, load_lm
from tests.helpers.train_util import toy_trajectories


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_process_reports_its_resident_memory_and_a_peak_that_resets() -> None:
    assert memory.rss_gb() > 0
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    assert memory.peak_rss_gb() >= memory.rss_gb() > 0.06
    del big
    memory.release()
    assert memory.reset_peak()
    assert memory.peak_rss_gb() <= memory.rss_gb() + 0.01  # a new mark, at today's size
    m = memory.step_memory()
    assert set(m) == {"mem/peak_rss_gb", "mem/rss_gb"} and m["mem/peak_rss_gb"] > 0


def test_the_report_keeps_each_phases_peak(tmp_path) -> None:
    report = Report(tmp_path)

    async def phase() -> int:
        return 7

    assert asyncio.run(report.timed("eval_start", phase())) == 7
    report.peak("gspo", 1.234)
    report.peak("gspo", 0.5)  # a resumed phase keeps the most of its parts
    d = report.as_dict()
    assert d["peak_rss_gb"]["gspo"] == 1.23 and d["peak_rss_gb"]["eval_start"] > 0
    report.save()
    assert Report.load(tmp_path).peak_rss_gb == d["peak_rss_gb"]


def test_the_prefix_store_is_bounded_in_bytes_too() -> None:
    def entry(start: int, n: int) -> Prefix:
        kv = [torch.zeros(1, n, 256)]  # 1 kB a column and tensor: 2 kB a column
        return Prefix(tuple(range(start, start + n)), kv, kv)

    store = PrefixStore(max_tokens=10_000, min_reuse=4, max_bytes=100 * 2048)
    store.put(entry(0, 60))
    store.put(entry(1000, 30))
    assert store.nbytes == 90 * 2048 and len(store) == 2
    store.put(entry(2000, 30))  # 120 columns > 100: the least recently used goes, by bytes
    assert store.nbytes == 60 * 2048 and store.match(list(range(0, 61))) is None
    store.put(entry(5000, 101))  # alone over the byte bound: not kept
    assert store.nbytes == 60 * 2048
    store.clear()
    assert store.nbytes == 0 and store.tokens == 0


def test_auto_checkpointing_follows_the_activation_estimate() -> None:
    lm = load_lm(TrainerConfig(model="tiny-qwen3"))
    per_token = activation_bytes_per_token(lm)
    assert per_token == 4 * (18 * 128 + 4 * 384) * 4  # 4 layers, hidden 128, MLP 384, fp32
    assert not wants_checkpointing("auto", lm, 8192, budget_gb=1.0)
    assert wants_checkpointing("auto", lm, 8192, budget_gb=per_token * 8000 / 1e9)
    assert wants_checkpointing(True, lm, 1, budget_gb=1.0) and not wants_checkpointing(False, lm, 10**9, 1e-9)
    on = Trainer(TrainerConfig(model="tiny-qwen3", activation_budget_gb=1e-6))
    off = Trainer(TrainerConfig(model="tiny-qwen3"))
    flag = (
        "is_activation_checkpointing" if hasattr(on.lm, "is_activation_checkpointing") else "is_gradient_checkpointing"
    )
    assert on.checkpointing and getattr(on.lm, flag)
    assert not off.checkpointing and not getattr(off.lm, flag)


def test_sft_in_small_micro_batches_takes_the_same_step(one_thread) -> None:
    """The trainer's micro-batch budget bounds SFT's activations; the summed gradient is the same."""
    base = Trainer(TrainerConfig(model="tiny-qwen3", lr=1e-3, seed=0))
    demos = toy_trajectories(base.lm)
    assert len(pack([(i, t, 1.0) for i, t in enumerate(demos)], "trajectory", max_tokens=20)) == len(demos)
    lms = []
    for max_tokens in (1 << 30, 20):  # one micro-batch, or one per demonstration
        trainer = Trainer(TrainerConfig(model="tiny-qwen3", lr=1e-3, seed=0), lm=copy.deepcopy(base.lm))
        cfg = SFTConfig(steps=2, batch_size=4, lr=1e-3, warmup_steps=1)
        sft(trainer.policy, demos, cfg, trainer.optimizer, opts=trainer.opts, max_tokens=max_tokens)
        assert all(p.grad is None for p in trainer.policy.parameters())  # freed, not held to the next phase
        lms.append(trainer.lm)
    for a, b in zip(lms[0].parameters(), lms[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # summation order, through AdamW's normalisation


def test_a_gspo_step_frees_its_gradients(one_thread) -> None:
    trainer = Trainer(TrainerConfig(model="tiny-qwen3", lr=1e-3, seed=0))
    m = trainer.step(toy_trajectories(trainer.lm, n=8, prompts=2))  # groups whose rewards differ
    assert m["train/trained"] == 1.0 and m["train/grad_norm"] > 0
    assert all(p.grad is None for p in trainer.policy.parameters())
