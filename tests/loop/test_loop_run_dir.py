"""A run directory belongs to one run: a second `legorl train` into it is refused (or, with
`--overwrite`, starts afresh), `--resume` loads only this run's checkpoints of this config,
the warm start ends with a checkpoint (a kill in step 0 resumes there), and checkpoint
pruning never deletes a run's fresh checkpoint because older-looking ones lie beside it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.loop_util import one_call_agent

LEGORL = [sys.executable, "-m", "legorl.cli"]
AGENT = one_call_agent(max_tokens=8)

CONFIG = """
[run]
dir = "{dir}"
tasks = "quickstart-calc"
steps = {steps}
tasks_per_step = 1
group_size = 2
[calc_tasks]
train = 8
heldout = 4
[engine]
kind = "hf"
model = "quickstart-qwen3"
[proxy]
max_tokens = 16
[harness]
name = "command"
command_file = "{agent}"
[trainer]
model = "quickstart-qwen3"
lr = {lr}
[warm_start]
episodes = 2
steps = 4
batch_size = 2
warmup_steps = 0
[warm_start.engine]
kind = "quickstart-expert"
model = "quickstart-qwen3"
"""


def write_config(path: Path, run_dir: Path, *, steps: int = 1, lr: float = 1e-5) -> Path:
    agent = path.parent / "agent.sh"
    agent.write_text(AGENT)
    path.write_text(CONFIG.format(dir=run_dir, steps=steps, lr=lr, agent=agent))
    return path


def legorl_train(config: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEGORL, "train", str(config), *flags], capture_output=True, text=True, timeout=600)


def refused(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def store_rows(run_dir: Path) -> dict[str, object]:
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        info = json.loads(db.execute("SELECT info FROM runs").fetchone()[0])
        per_step = dict(db.execute("SELECT coalesce(step, 'none'), count(*) FROM trajectories GROUP BY 1"))
        null = db.execute("SELECT count(*) FROM trajectories WHERE status IS NULL").fetchone()[0]
    return {"run_id": info.get("run_id"), "per_step": per_step, "null_status": null}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished run (2 demonstrations, a warm start, one GSPO step of 2 rollouts)."""
    root = tmp_path_factory.mktemp("finished")
    proc = legorl_train(write_config(root / "run.toml", root / "run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "run"


def copy_of(finished_run: Path, tmp_path: Path, **kw: object) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    return write_config(tmp_path / "run.toml", run_dir, **kw), run_dir  # type: ignore[arg-type]


def test_a_second_start_is_refused_and_overwrite_starts_afresh(finished_run: Path, tmp_path: Path) -> None:
    config, run_dir = copy_of(finished_run, tmp_path)
    before = store_rows(run_dir)
    refused(legorl_train(config), "already holds a run", "--resume", "another run.dir", "--overwrite")
    assert store_rows(run_dir) == before and before["per_step"] == {-1: 2, 0: 2}, before  # nothing merged into it
    again = legorl_train(config, "--overwrite")
    assert again.returncode == 0, again.stderr[-3000:]
    after = store_rows(run_dir)
    assert after["per_step"] == {-1: 2, 0: 2} and before["run_id"] != after["run_id"] is not None, after  # the new run
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["step_00000000", "step_00000001"], ckpts  # the new run's, after its warm start and step 0


def test_overwrite_deletes_only_what_a_run_writes(finished_run: Path, tmp_path: Path) -> None:
    config, run_dir = copy_of(finished_run, tmp_path)
    (run_dir / "notes.txt").write_text("mine")
    refused(legorl_train(config, "--overwrite"), "files a run does not write (notes.txt)", "refusing")
    assert (run_dir / "notes.txt").exists() and (run_dir / "run.sqlite").exists()


def test_resume_refuses_another_runs_checkpoint_and_a_changed_config(finished_run: Path, tmp_path: Path) -> None:
    config, run_dir = copy_of(finished_run, tmp_path)
    with sqlite3.connect(run_dir / "run.sqlite") as db:  # this directory's run is now another one
        info = json.loads(db.execute("SELECT info FROM runs").fetchone()[0])
        db.execute("UPDATE runs SET info = ?", (json.dumps({**info, "run_id": "0123456789ab"}),))
    refused(
        legorl_train(config, "--resume"), "--resume: checkpoint", f"belongs to run {info['run_id']}", "0123456789ab"
    )
    with sqlite3.connect(run_dir / "run.sqlite") as db:
        db.execute("UPDATE runs SET info = ?", (json.dumps(info),))
    changed = write_config(tmp_path / "run.toml", run_dir, lr=3e-5)
    refused(legorl_train(changed, "--resume"), "--resume: the config differs", "trainer.lr")
    assert store_rows(run_dir)["per_step"] == {-1: 2, 0: 2}  # refused before anything was written


def test_resume_takes_another_concurrency_and_checkpoints_hashed_before_it_was_free(tmp_path: Path) -> None:
    """How many rollouts run at once is not what a run trains: a resume may lower it (32
    OpenCode processes on two cores ran demonstrations past their limit), including on a
    checkpoint whose hash still counted it. A setting that is trained on is still refused."""
    from legorl.loop.config import load_run_config
    from legorl.loop.errors import RunError
    from legorl.loop.run_dir import check_checkpoint, config_hash

    cfg = load_run_config(write_config(tmp_path / "run.toml", tmp_path / "run"))
    info = {"info": {"run_id": "r1"}, "config": cfg.model_dump(mode="json")}
    fewer = cfg.model_copy(deep=True)
    fewer.run.max_concurrent_rollouts = cfg.run.max_concurrent_rollouts + 7
    check_checkpoint(tmp_path / "ckpt", {"run_id": "r1", "config_hash": config_hash(cfg)}, info, fewer)
    older = {"run_id": "r1", "config_hash": "hashed-with-concurrency"}  # an older legorl's checkpoint
    check_checkpoint(tmp_path / "ckpt", older, info, fewer)
    slower = fewer.model_copy(deep=True)
    slower.trainer.lr = cfg.trainer.lr * 10
    with pytest.raises(RunError, match=r"the config differs .*\(trainer\.lr\)"):
        check_checkpoint(tmp_path / "ckpt", older, info, slower)
    with pytest.raises(RunError, match="the config differs"):  # nothing stored to compare with
        check_checkpoint(tmp_path / "ckpt", older, {"info": {"run_id": "r1"}}, fewer)


@pytest.mark.slow
def test_a_kill_in_step_0_after_the_warm_start_resumes_at_step_0(tmp_path: Path) -> None:
    """SIGKILL once step 0's rollouts are under way: `--resume` continues from the
    checkpoint written after the warm start (demonstrations and SFT are not redone), and
    step 0 ends with one group (the killed attempt's rollouts kept as abandoned)."""
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "run.toml", run_dir, steps=2)
    proc = subprocess.Popen(
        [*LEGORL, "train", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline, begun = time.monotonic() + 300, False
        while time.monotonic() < deadline and proc.poll() is None and not begun:
            try:
                with sqlite3.connect(f"file:{run_dir / 'run.sqlite'}?mode=ro", uri=True) as db:
                    begun = db.execute("SELECT count(*) FROM steps WHERE step = 0").fetchone()[0] > 0
            except sqlite3.OperationalError:
                pass
            time.sleep(0.05)
        assert begun and proc.poll() is None, proc.poll()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    resumed = legorl_train(config, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at step 0" in resumed.stderr and "warm start:" not in resumed.stderr, resumed.stderr[-2000:]
    rows = store_rows(run_dir)
    assert rows["per_step"].get(-1) == 2 and rows["per_step"].get(0) == 2 and rows["per_step"].get(1) == 2, rows
    assert rows["null_status"] == 0


def test_pruning_keeps_the_new_checkpoint_beside_older_looking_ones(tmp_path: Path) -> None:
    """`keep_checkpoints = 1` with another run's step_3 and step_4 in the directory: the
    checkpoint just written (step 0, then 1) survives, and only lower steps are pruned."""
    import torch

    from legorl.train.config import TrainerConfig
    from legorl.train.trainer import Trainer

    torch.set_num_threads(1)
    ckpt = tmp_path / "ckpt"
    for stale in ("step_00000003", "step_00000004"):
        (ckpt / stale).mkdir(parents=True)
    trainer = Trainer(TrainerConfig(model="tiny-qwen3", checkpoint_dir=str(ckpt), keep_checkpoints=1))
    assert trainer.save_checkpoint().is_dir()
    trainer.step_count = 1
    assert trainer.save_checkpoint().is_dir()
    trainer.step_count = 2
    trainer.save_checkpoint()
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["step_00000001", "step_00000002", "step_00000003", "step_00000004"], names
