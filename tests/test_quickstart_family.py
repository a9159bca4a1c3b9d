"""The quickstart's tasks, expert and grading, run for real (sh, sed, python) in tmp dirs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from legorl.quickstart import family
from legorl.quickstart.dialogue import Dialogue, load_agent_config
from legorl.quickstart.expert import (
    ExpertEngine,
    expert_draw,
    expert_reply,
    failing_function,
    first_function,
    fix_command,
)
from legorl.quickstart.workspace import (
    DirWorkspace,
    command_env,
    fast_python_dir,
    grade_source,
    outcome_of,
)
from legorl.types import SamplingParams, Status


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return command_env(fast_python_dir(tmp_path_factory.mktemp("bin")))


def test_splits_are_deterministic_and_disjoint() -> None:
    train, heldout = family.tasks("train", 2000), family.tasks("heldout", 300)
    assert [t.instance_id for t in family.tasks("train", 50)] == [t.instance_id for t in train[:50]]
    assert all(family.split_of(t) == "train" for t in train) and all(family.split_of(t) == "heldout" for t in heldout)
    files = {(t.names, t.buggy, t.wrong_op) for t in train}
    assert not any((t.names, t.buggy, t.wrong_op) in files for t in heldout)
    assert len({t.instance_id for t in heldout}) == 300
    with pytest.raises(ValueError, match="split must be"):
        family.tasks("test", 1)


def test_test_script_names_the_failing_function(tmp_path: Path, env: dict[str, str]) -> None:
    for task in family.tasks("train", 12, k=3):
        ws = DirWorkspace(task, tmp_path, env)
        res = ws.execute(family.TEST_CMD)
        assert res["returncode"] == 1
        lines = res["output"].splitlines()
        assert [ln.split()[1].rstrip(":") for ln in lines] == list(task.names)
        assert failing_function(res["output"]) == task.buggy and first_function(res["output"]) == task.names[0]
        # the in-process runner (corpora, unit tests) prints exactly what the script prints
        assert family.run_tests_in_process(task, task.source()) == (res["output"], 1)
        ws.close()


def test_expert_fix_resolves_only_the_failing_function(tmp_path: Path, env: dict[str, str]) -> None:
    for task in family.tasks("train", 24, k=3):  # every operator, `//` included, survives sed
        for name in task.names:
            ws = DirWorkspace(task, tmp_path, env)
            out = ws.execute(fix_command(name))
            assert out["returncode"] == 0 and out["output"].startswith("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
            outcome = outcome_of("Submitted", ws)
            assert (outcome.status == Status.RESOLVED) == (name == task.buggy), (task, name, outcome)
            assert outcome.tests[f"test_{task.buggy}"] == ("passed" if name == task.buggy else "failed")
            ws.close()


def test_grading_restores_the_tests(tmp_path: Path, env: dict[str, str]) -> None:
    task = family.tasks("train", 1)[0]
    ws = DirWorkspace(task, tmp_path, env)
    ws.execute("printf 'raise SystemExit(0)\\n' > test_calc.py")  # the agent guts its copy of the tests
    assert ws.execute(family.TEST_CMD)["returncode"] == 0
    assert ws.grade().status == Status.FAILED  # graded against the task's own test file
    assert grade_source(task, task.source(fixed=True), tmp_path, env).status == Status.RESOLVED
    ws.close()
    assert not ws.dir.exists()


def test_agent_exits_map_to_statuses(tmp_path: Path, env: dict[str, str]) -> None:
    ws = DirWorkspace(family.tasks("train", 1)[0], tmp_path, env)
    assert outcome_of("LimitsExceeded", ws).status == Status.MAX_TURNS
    assert outcome_of("RepeatedFormatError", ws).status == Status.FORMAT_ERROR
    infra = outcome_of("APIConnectionError", ws, "connection refused")
    assert infra.status == Status.INFRA_ERROR and infra.masked
    ws.close()


def test_gold_patch_applies_with_git(tmp_path: Path) -> None:
    task = family.tasks("heldout", 1)[0]
    for name, text in task.files().items():
        (tmp_path / name).write_text(text)
    (tmp_path / "fix.diff").write_text(task.gold_patch())
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / family.SOURCE_FILE).read_text() == task.source(fixed=True)
    t = task.to_task("heldout")
    assert t.FAIL_TO_PASS == [f"test_{task.buggy}"] and len(t.PASS_TO_PASS) == len(task.names) - 1


def test_expert_reply_reads_the_fail_line_p_read_of_the_time() -> None:
    obs = "<returncode>1</returncode>\n<output>\nPASS add\nFAIL mul: got 7, expected 12\nPASS xor\n</output>"
    assert "python test_calc.py" in expert_reply(None, 0.0, 0.3)
    assert "python test_calc.py" in expert_reply("<output>\n3 passed\n</output>", 0.0, 0.3)
    assert "def mul(a, b): return a * b" in expert_reply(obs, 0.1, 0.3)
    assert "def add(a, b): return a + b" in expert_reply(obs, 0.9, 0.3)


async def test_expert_engine_answers_from_the_rendered_prompt() -> None:
    from legorl.models import load_tokenizer
    from legorl.proxy.render import ChatRequest, Renderer

    tok = load_tokenizer("quickstart-qwen3")
    renderer, cfg = Renderer(tok), load_agent_config()
    task = family.tasks("train", 1, k=3)[0]
    out, code = family.run_tests_in_process(task, task.source())
    dialogue = Dialogue(cfg, family.PROBLEM)
    engine = ExpertEngine(tok, p_read=0.3, seed=1)
    first = await engine.generate(renderer.render(ChatRequest(dialogue.messages)), SamplingParams(max_tokens=64))
    text = tok.decode(first.completion_ids[:-1])
    assert dialogue.on_reply(text, "stop") == family.TEST_CMD
    dialogue.on_output({"output": out, "returncode": code, "exception_info": ""})
    prompt = renderer.render(ChatRequest(dialogue.messages))
    reply = engine.reply_for(prompt)
    assert reply == engine.reply_for(prompt)  # deterministic: concurrency cannot change the data
    assert reply == expert_reply(out, expert_draw(1, out), 0.3)  # the in-process expert agrees
    assert f"def {task.buggy}(" in reply or f"def {task.names[0]}(" in reply


def test_expert_success_rate_matches_its_definition() -> None:
    tasks = family.tasks("train", 3000, k=3)
    wins = reads = 0
    for t in tasks:
        out, _ = family.run_tests_in_process(t, t.source())
        wins += f"def {t.buggy}(" in expert_reply(out, expert_draw(0, out), 0.3)
        reads += expert_draw(0, out) < 0.3
    assert abs(reads / len(tasks) - 0.3) < 0.03
    assert abs(wins / len(tasks) - (0.3 + 0.7 / 3)) < 0.03


def test_commands_fail_like_mini_swe_agent(tmp_path: Path, env: dict[str, str]) -> None:
    from legorl.quickstart.workspace import OUTPUT_CAP, run_command

    nul = run_command("echo a\x00b", tmp_path, env, 5)  # the policy can sample a NUL byte
    assert nul == {"output": "", "returncode": -1,
                   "exception_info": "An error occurred while executing the command: embedded null byte"}  # fmt: skip
    slow = run_command("echo started; sleep 30", tmp_path, env, 1)
    assert slow["returncode"] == -1 and slow["output"] == "started\n"
    assert slow["exception_info"].endswith("Command 'echo started; sleep 30' timed out after 1 seconds")
    flood = run_command("yes", tmp_path, env, 30)
    assert flood["returncode"] == -1 and len(flood["output"]) == OUTPUT_CAP and "exceeded" in flood["exception_info"]
    cfg = load_agent_config()
    from legorl.quickstart.dialogue import observation_text

    shown = observation_text(cfg, flood)
    assert "<warning>" in shown and len(shown) < 1000  # head and tail only: it fits the 2048-token context


def test_episode_that_outgrows_the_context_is_graded(tmp_path: Path, env: dict[str, str]) -> None:
    from legorl.models import load_tokenizer
    from legorl.proxy.render import Renderer
    from legorl.quickstart.inproc import Episode, run_episodes

    task = family.tasks("train", 1, k=3)[0]
    ep = Episode(task.instance_id, Dialogue(load_agent_config(), family.PROBLEM), DirWorkspace(task, tmp_path, env))
    reply = "```mswea_bash_command\nseq 1 400\n```"  # ~1100 tokens of output per turn
    run_episodes([ep], Renderer(load_tokenizer("quickstart-qwen3")), reply_fn=lambda e, obs: reply, max_context=512)
    assert ep.dialogue.exit_status == "ContextWindowExceededError"
    assert ep.outcome is not None and ep.outcome.status == Status.FAILED  # graded: the bug is still there
