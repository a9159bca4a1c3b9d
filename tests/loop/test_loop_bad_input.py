"""`legorl train` on foreseeable mistakes: one message naming what and how to fix it, a
non-zero exit, no traceback — a broken task source, a missing harness layer, a sandbox
backend that cannot start a sandbox, a warm-start checkpoint that does not fit the model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LEGORL = [sys.executable, "-m", "legorl.cli"]


def config(tmp_path: Path, **sections: str) -> Path:
    base = {
        "run": f'dir = "{tmp_path / "run"}"\ntasks = "quickstart-calc"\nsteps = 1\ntasks_per_step = 1\ngroup_size = 2',
        "calc_tasks": "train = 8\nheldout = 4",
        "engine": 'kind = "hf"\nmodel = "quickstart-qwen3"',
        "proxy": "max_tokens = 16",
        "harness": 'name = "mini-swe-agent-warm"\nmax_turns = 2\noptions = { config = "quickstart" }',
        "trainer": 'model = "quickstart-qwen3"',
    }
    base.update(sections)
    path = tmp_path / "run.toml"
    path.write_text("\n".join(f"[{k}]\n{v}\n" for k, v in base.items()))
    return path


def train(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LEGORL, "train", str(path)], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


def one_message(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for n in needles:
        assert n in proc.stderr, proc.stderr[-2000:]


def test_missing_and_broken_task_files(tmp_path: Path) -> None:
    one_message(
        train(config(tmp_path, run=f'dir = "{tmp_path}/run"\ntasks = "missing.jsonl"')), "missing.jsonl", "no such file"
    )
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"instance_id": "a"}\nnot json\n')
    one_message(
        train(config(tmp_path, run=f'dir = "{tmp_path}/run"\ntasks = "{bad}"')),
        "tasks.jsonl:1: missing field",
        "tasks.jsonl:2: not valid JSON",
    )
    assert not (tmp_path / "run" / "run.sqlite").exists()  # refused before a run store was opened


def test_missing_harness_layer(tmp_path: Path) -> None:
    empty = tmp_path / "no-harnesses"
    empty.mkdir()
    one_message(train(config(tmp_path), LEGORL_HARNESS_ROOT=str(empty)), "mini-swe-agent", "setup_harnesses.sh")


@pytest.mark.docker
def test_a_backend_that_cannot_start_a_sandbox(tmp_path: Path) -> None:
    proc = train(config(tmp_path, sandbox='backend = "docker"'), DOCKER_SOCKET=str(tmp_path / "no.sock"))
    one_message(proc, "'docker' sandbox backend cannot start a sandbox", "legorl doctor")


def test_warm_start_checkpoint_of_another_model(tmp_path: Path) -> None:
    from legorl.models import resolve_model

    other = resolve_model("tiny-qwen3")  # same family, other sizes
    # refused at start-up: before the start evaluation's rollouts spend their time
    proc = train(config(tmp_path, warm_start=f'checkpoint = "{other}"', heldout='tasks = 2\nat = ["start", "end"]'))
    one_message(
        proc, "warm_start.checkpoint", "does not match the model", "vocab_size is 4096 there, 512 here", "another model"
    )
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "held-out start" not in proc.stdout
    proc = train(config(tmp_path, warm_start=f'checkpoint = "{tmp_path / "nowhere"}"'))
    one_message(proc, "warm_start.checkpoint", "does not exist")


def test_rollout_with_an_unknown_instance(tmp_path: Path) -> None:
    from legorl.tasks.loader import shipped_tasks_dir

    proc = subprocess.run(
        [
            *LEGORL,
            "rollout",
            "--tasks",
            str(shipped_tasks_dir() / "train.jsonl"),
            "--instance",
            "nope",
            "--harness",
            "command",
            "--command-file",
            "/dev/null",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    one_message(proc, "--instance: no task 'nope'")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_full_disk_for_checkpoints_is_one_message_and_resume_continues(tmp_path: Path) -> None:
    """Checkpoints on an 8 MB tmpfs: step 0's (5.4 MB) fits, step 1's does not → one
    message, nothing half-written left; more room, `--resume` re-runs step 1 (the first
    attempt's rollouts kept as abandoned) and finishes."""
    import sqlite3

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(ckpt)], check=True)
    try:
        run = f'dir = "{tmp_path / "run"}"\ntasks = "quickstart-calc"\nsteps = 3\ntasks_per_step = 1\ngroup_size = 2'
        path = config(
            tmp_path, run=run, trainer=f'model = "quickstart-qwen3"\ncheckpoint_dir = "{ckpt}"\nkeep_checkpoints = 0'
        )
        first = train(path)
        one_message(first, "cannot write checkpoint", "--resume")
        assert [p.name for p in ckpt.iterdir()] == ["step_00000001"]  # no .tmp_step_* left behind
        subprocess.run(["mount", "-o", "remount,size=64m", str(ckpt)], check=True)
        second = subprocess.run([*LEGORL, "train", str(path), "--resume"], capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr[-3000:]
        with sqlite3.connect(tmp_path / "run" / "run.sqlite") as db:
            closed = [s for (s,) in db.execute("SELECT step FROM steps WHERE t_end IS NOT NULL ORDER BY step")]
            abandoned = db.execute("SELECT count(*) FROM flags WHERE flag = 'abandoned'").fetchone()[0]
            per_step = dict(db.execute("SELECT step, count(*) FROM trajectories WHERE step >= 0 GROUP BY step"))
        assert closed == [0, 1, 2] and abandoned == 2 and per_step == {0: 2, 1: 2, 2: 2}
    finally:
        subprocess.run(["umount", "-l", str(ckpt)], check=False)


def test_a_task_whose_repository_is_broken_is_masked_not_a_crash(tmp_path: Path) -> None:
    """A bundle that passes the loader's header check but holds no usable commit: that task's
    rollout is a masked infra_error naming the reason (a run would go on with the others)."""
    import json

    from legorl.tasks.loader import shipped_tasks_dir

    row = json.loads((shipped_tasks_dir() / "train.jsonl").read_text().splitlines()[0])
    (tmp_path / "broken.bundle").write_bytes(b"# v2 git bundle\nnot a pack\n")
    row.update(repo_path="broken.bundle", instance_id="broken-1")
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "agent.sh").write_text("true\n")
    proc = subprocess.run(
        [
            *LEGORL,
            "rollout",
            "--tasks",
            str(tmp_path / "tasks.jsonl"),
            "--instance",
            "broken-1",
            "--harness",
            "command",
            "--command-file",
            str(tmp_path / "agent.sh"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["status"] == "infra_error" and line["masked"] and line["flags"] == ["task_image"], line
    assert "bundle" in line["evidence"]["error"] or "commit" in line["evidence"]["error"]


def test_a_dead_engine_is_one_message_before_any_rollout(tmp_path: Path) -> None:
    """An HTTP engine nobody answers at: one cheap request before the first rollout finds it
    (issue 39: it used to mask every rollout, train and checkpoint a step of no data, and
    end only at the weight sync), and the message names the server and what to do."""
    import sqlite3

    served = tmp_path / "served"
    served.mkdir()
    engine = f'kind = "vllm"\nmodel = "quickstart-qwen3"\nurl = "http://127.0.0.1:9"\nserved_model_dir = "{served}"'
    proc = train(config(tmp_path, engine=engine, sandbox="retries = 1"))
    one_message(proc, "engine.url http://127.0.0.1:9 does not answer", "start the vllm server")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    if (tmp_path / "run" / "run.sqlite").exists():
        with sqlite3.connect(tmp_path / "run" / "run.sqlite") as db:
            assert db.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 0
    assert not (tmp_path / "run" / "checkpoints").exists()
    one_message(
        train(config(tmp_path, engine='kind = "vllm"\nmodel = "quickstart-qwen3"\nurl = "http://127.0.0.1:9"')),
        "engine.served_model_dir is required",
    )


@pytest.mark.parametrize(
    ("section", "body", "line"),
    [
        (
            "harness",
            'name = "mini-swe-agent-warm"\noptions = { bogus = 1 }',
            "harness.options.bogus: unknown option for mini-swe-agent-warm (known: command_timeout_s, config, "
            "max_output_tokens)",
        ),
        ("harness", 'name = "mini-swe-agent-warm"\noptions = { config = 5 }', "harness.options.config: expected str"),
        ("harness", 'name = "codex"\noptions = { sub_agents = [1] }', "harness.options.sub_agents: expected bool"),
        ("harness", 'name = "opencode"\noptions = { max_turns = 3 }', "harness.options.max_turns: unknown option"),
        ("engine", 'kind = "hf"\noptions = { bogus = 1 }', "engine.options.bogus: unknown option for engine kind 'hf'"),
        (
            "engine",
            'kind = "vllm"\nurl = "http://x"\noptions = { route = "x" }',
            "engine.options.route: expected one of",
        ),
        (
            "warm_start.engine",
            'kind = "quickstart-expert"\noptions = { p_read = "high" }',
            "warm_start.engine.options.p_read: expected float, got str",
        ),
        (
            "warm_start.engine",
            'kind = "quickstart-expert"\noptions = { p_read = 2 }',
            "warm_start.engine.options.p_read: input should be less than or equal to 1",
        ),
        (
            "warm_start.engine",
            'kind = "quickstart-expert"\noptions = { habit = "last" }',
            "warm_start.engine.options.habit: expected one of",
        ),
    ],
)
def test_every_option_is_checked_when_the_config_loads(tmp_path: Path, section: str, body: str, line: str) -> None:
    """Options are checked against the component's own declaration (the adapter's dataclass,
    the engine's `Options`) at load time: one line with the dotted name, not a traceback
    when the component is built."""
    from legorl.config import ConfigError
    from legorl.loop.config import load_run_config

    path = tmp_path / "run.toml"
    path.write_text(f"[{section}]\n{body}\n")
    with pytest.raises(ConfigError) as err:
        load_run_config(path)
    assert f"\n  {line}" in str(err.value), str(err.value)
    assert len(str(err.value).splitlines()) == 2  # the file, then this one problem


def test_bad_options_and_missing_models_write_nothing(tmp_path: Path) -> None:
    """Through the CLI: one message naming the field, non-zero exit, and no run directory
    (no run.sqlite) left behind by a config that was never valid."""
    proc = train(config(tmp_path, harness='name = "mini-swe-agent-warm"\noptions = { bogus = 1 }'))
    one_message(proc, "harness.options.bogus: unknown option for mini-swe-agent-warm")
    proc = train(config(tmp_path, engine='kind = "hf"\nmodel = "no-such-model"'))
    one_message(proc, "engine.model: model 'no-such-model'")
    proc = train(config(tmp_path, trainer='model = "no-such-model"'))
    one_message(proc, "trainer.model: model 'no-such-model'")
    proc = train(config(tmp_path, warm_start="episodes = 2"))  # its engine's model: tiny-qwen3, another vocabulary
    one_message(
        proc, "warm_start.engine.model 'tiny-qwen3' has another tokenizer than trainer.model 'quickstart-qwen3'"
    )
    assert not (tmp_path / "run").exists()


def test_a_run_over_its_time_budget_is_refused_at_start_up(tmp_path: Path) -> None:
    """The pre-flight measures the trainer (and a CPU engine's prefill) and refuses a config
    whose least work already exceeds `run.time_budget_s`, before any rollout runs."""
    run = f'dir = "{tmp_path / "run"}"\ntasks = "quickstart-calc"\nsteps = 5000\ntasks_per_step = 1\ngroup_size = 2'
    proc = train(config(tmp_path, run=run + "\ntime_budget_s = 1"))
    one_message(proc, "time budget 1s", "this run cannot fit", "tokens/s", "raise run.time_budget_s")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    from legorl.store.run_store import RunStore

    if (tmp_path / "run" / "run.sqlite").exists():  # refused before the first rollout (or before the store)
        with RunStore(tmp_path / "run", readonly=True) as store:
            assert store.list_trajectories(limit=1)["total"] == 0


def test_doctor_says_the_same_about_the_budget(tmp_path: Path) -> None:
    from legorl.loop.config import RunConfig
    from legorl.loop.preflight import budget_check, preflight_checks
    from legorl.monitor.doctor import run_one

    base = {
        "run": {"dir": str(tmp_path / "run"), "tasks": "quickstart-calc", "steps": 5000, "group_size": 2},
        "calc_tasks": {"train": 8, "heldout": 4},
        "engine": {"kind": "hf", "model": "quickstart-qwen3"},
        "trainer": {"model": "quickstart-qwen3"},
    }
    assert "time budget" not in [c.name for c in preflight_checks(RunConfig.model_validate(base))]
    over = RunConfig.model_validate({**base, "run": {**base["run"], "time_budget_s": 1}})
    res = run_one(budget_check(over))
    assert not res.ok and "this run cannot fit" in res.detail, res.detail
    fits = RunConfig.model_validate({**base, "run": {**base["run"], "steps": 2, "time_budget_s": 3600}})
    res = run_one(budget_check(fits))
    assert res.ok and "needs at least" in res.detail, (res.detail, res.fix)
