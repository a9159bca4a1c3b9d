"""The quickstart's task family, its task source and its demonstrator — through the real
grading (legorl.verify in local sandboxes), not a grader of its own."""

from __future__ import annotations

import collections
import difflib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from legorl.quickstart import family
from legorl.quickstart.expert import (
    ExpertEngine,
    expert_draw,
    expert_reply,
    failing_function,
    first_function,
    listed_functions,
)
from legorl.quickstart.source import CalcTasksSection, ensure_task_file
from legorl.tasks.loader import load_tasks
from legorl.types import SamplingParams, Status


def test_splits_are_deterministic_and_disjoint() -> None:
    train, heldout = family.tasks("train", 2000), family.tasks("heldout", 300)
    assert [t.instance_id for t in family.tasks("train", 50)] == [t.instance_id for t in train[:50]]
    assert all(family.split_of(t) == "train" for t in train) and all(family.split_of(t) == "heldout" for t in heldout)
    files = {(t.names, t.buggy, t.wrong_op) for t in train}
    assert not any((t.names, t.buggy, t.wrong_op) in files for t in heldout)
    assert len({t.instance_id for t in heldout}) == 300
    with pytest.raises(ValueError, match="split must be"):
        family.tasks("test", 1)


def test_test_file_runs_as_script_and_under_pytest(tmp_path: Path) -> None:
    task = family.tasks("train", 1, k=3)[0]
    for name, text in task.files().items():
        (tmp_path / name).write_text(text)
    script = subprocess.run(["python3", family.TEST_FILE], cwd=tmp_path, capture_output=True, text=True)
    assert script.returncode == 1
    assert failing_function(script.stdout) == task.buggy and first_function(script.stdout) == task.names[0]
    assert family.run_tests_in_process(task, task.source()) == (script.stdout, 1)
    junit = tmp_path / "r.xml"
    subprocess.run(
        ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", family.TEST_FILE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    report = junit.read_text()
    assert report.count("<testcase") == len(task.names) and report.count("<failure") == 1
    assert f'name="test_{task.buggy}"' in report


def test_task_source_is_swe_bench_format_with_a_repository(tmp_path: Path) -> None:
    cfg = CalcTasksSection(train=40, heldout=10)
    path = ensure_task_file(tmp_path, cfg)
    assert ensure_task_file(tmp_path, cfg) == path  # cached by content key
    tasks = load_tasks(path)
    assert {t.split for t in tasks} == {"train", "heldout"} and len(tasks) == 50
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row, task in zip(rows, tasks, strict=True):
        repo = Path(task.repo_path)
        files = subprocess.run(
            ["git", "-C", str(repo), "ls-tree", "--name-only", row["base_commit"]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert files == [family.SOURCE_FILE, family.TEST_FILE]
        parents = subprocess.run(
            ["git", "-C", str(repo), "rev-list", "--count", row["base_commit"]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert parents == "1"  # a root commit: no other task's repository in its history
        assert task.FAIL_TO_PASS[0].startswith("test_calc.py::test_") and task.test_cmd == family.GRADE_CMD
    # the same parameters give the same commit ids on any machine
    again = ensure_task_file(tmp_path / "other", cfg)
    assert [json.loads(x)["base_commit"] for x in again.read_text().splitlines()] == [r["base_commit"] for r in rows]


async def test_tasks_validate_through_the_real_grader(tmp_path: Path, backend: Any) -> None:
    """Gold patch → resolved, empty diff → not, a calc.py that forges the PASS lines → not
    (both backends)."""
    from legorl.tasks.image import TaskImages
    from legorl.tasks.validate import check_task
    from legorl.verify.grade import grade

    tasks = load_tasks(ensure_task_file(tmp_path, CalcTasksSection(train=4, heldout=2)))
    images = TaskImages(backend=backend.name)
    for task in tasks[:3]:
        check = await check_task(task, backend, images)
        assert check.ok, check.to_json()
    task = tasks[0]
    quick = next(q for q in family.tasks("train", 4, k=3) if q.instance_id == task.instance_id)
    lines = [f"PASS {n}" for n in quick.names]
    forged_src = f"import sys\nprint({chr(10).join(lines)!r})\nsys.exit(0)\n" + quick.source()
    forged = "diff --git a/calc.py b/calc.py\n" + "".join(
        difflib.unified_diff(
            quick.source().splitlines(keepends=True), forged_src.splitlines(keepends=True), "a/calc.py", "b/calc.py"
        )
    )
    outcome = await grade(task, forged, backend, await images.for_task(task))
    assert outcome.status is Status.FAILED and outcome.tests[task.FAIL_TO_PASS[0]] != "passed", outcome
    assert outcome.reward == 0.0, outcome


def test_expert_reply_reads_the_fail_line_p_read_of_the_time() -> None:
    obs = "<returncode>1</returncode>\n<output>\nPASS add\nFAIL mul: got 7, expected 12\nPASS xor\n</output>"
    assert family.TEST_CMD in expert_reply(None, 0.0, 0.3)
    assert family.TEST_CMD in expert_reply("<output>\n3 passed\n</output>", 0.0, 0.3)
    assert "def mul(a, b): return a * b" in expert_reply(obs, 0.1, 0.3)
    assert "def add(a, b): return a + b" in expert_reply(obs, 0.9, 0.3)


async def test_expert_engine_answers_from_the_rendered_prompt() -> None:
    from legorl.models import load_tokenizer
    from legorl.proxy.chatml_renderer import ChatMLRenderer
    from legorl.proxy.renderer import ChatRequest

    tok = load_tokenizer("quickstart-qwen3")
    renderer = ChatMLRenderer(tok)
    task = family.tasks("train", 1, k=3)[0]
    out, _ = family.run_tests_in_process(task, task.source())
    engine = ExpertEngine(tok, p_read=0.3, seed=1)
    msgs = [{"role": "system", "content": "Reply with one block."}, {"role": "user", "content": family.PROBLEM}]
    first = await engine.generate(renderer.render(ChatRequest(msgs)), SamplingParams(max_tokens=64))
    assert family.TEST_CMD in tok.decode(first.completion_ids[:-1])
    msgs += [
        {"role": "assistant", "content": tok.decode(first.completion_ids[:-1])},
        {"role": "user", "content": f"<returncode>1</returncode>\n<output>\n{out}</output>"},
    ]
    prompt = renderer.render(ChatRequest(msgs))
    reply = engine.reply_for(prompt)
    assert reply == engine.reply_for(prompt)  # deterministic: concurrency cannot change the data
    obs = f"<returncode>1</returncode>\n<output>\n{out}</output>"
    assert reply == expert_reply(obs, expert_draw(1, obs), 0.3)
    assert f"def {task.buggy}(" in reply or f"def {task.names[0]}(" in reply
    # the k-th fix on the same test lines draws anew, in any order of arrival: as a set, the
    # demonstrations of one task are the same however concurrent sessions interleave
    replies = []
    for _ in range(40):
        g = await engine.generate(prompt, SamplingParams(max_tokens=64))
        replies.append(tok.decode(g.completion_ids[:-1]))
    assert replies == [expert_reply(obs, expert_draw(1, obs, k), 0.3) for k in range(40)]
    assert replies[0] == reply
    fixed = {n for n in task.names if any(f"def {n}(" in r for r in replies)}
    assert {task.buggy, task.names[0]} <= fixed, fixed  # the expert's spread, on one observation
    guesser = ExpertEngine(tok, p_read=0.3, seed=1, habit="guess")
    guessed = [guesser.reply_for(prompt, k) for k in range(40)]
    assert {n for n in task.names if any(f"def {n}(" in r for r in guessed)} == set(task.names)


def test_expert_success_rate_matches_its_definition() -> None:
    tasks = family.tasks("train", 3000, k=3)
    wins = reads = 0
    for t in tasks:
        out, _ = family.run_tests_in_process(t, t.source())
        wins += f"def {t.buggy}(" in expert_reply(out, expert_draw(0, out), 0.3)
        reads += expert_draw(0, out) < 0.3
    assert abs(reads / len(tasks) - 0.3) < 0.03
    assert abs(wins / len(tasks) - (0.3 + 0.7 / 3)) < 0.03


def test_the_guess_habit_spreads_its_wrong_choices_over_the_listed_functions() -> None:
    """`habit = "guess"`: the same success rate as `first`, but when it does not read, every
    listed function is picked about equally often, whichever place it has in the output."""
    tasks = family.tasks("train", 3000, k=3)
    wins, places = 0, [0, 0, 0]
    for t in tasks:
        out, _ = family.run_tests_in_process(t, t.source())
        draw = expert_draw(0, out)
        reply = expert_reply(out, draw, 0.3, habit="guess")
        wins += f"def {t.buggy}(" in reply
        if draw >= 0.3:
            listed = listed_functions(out)
            places[[f"def {n}(" in reply for n in listed].index(True)] += 1
    assert abs(wins / len(tasks) - (0.3 + 0.7 / 3)) < 0.03
    assert all(abs(n / sum(places) - 1 / 3) < 0.04 for n in places), places
    obs = "<output>\nPASS add\nFAIL mul: got 7, expected 12\nPASS xor\n</output>"
    assert "def mul(a, b): return a * b" in expert_reply(obs, 0.1, 0.3, habit="guess")
    assert "def add(a, b)" in expert_reply(obs, 0.31, 0.3, habit="guess")
    assert "def xor(a, b)" in expert_reply(obs, 0.99, 0.3, habit="guess")


def test_expert_engine_from_config_rejects_unknown_options() -> None:
    from legorl.engine.registry import EngineConfig, make_engine

    assert (
        make_engine(EngineConfig(kind="quickstart-expert", model="quickstart-qwen3", options={"p_read": 1.0})).p_read
        == 1.0
    )
    with pytest.raises(ValueError, match="unknown option"):
        make_engine(EngineConfig(kind="quickstart-expert", model="quickstart-qwen3", options={"p_raed": 1.0}))
    guess = EngineConfig(kind="quickstart-expert", model="quickstart-qwen3", options={"habit": "guess"})
    assert make_engine(guess).habit == "guess"
    with pytest.raises(ValueError, match="habit"):
        make_engine(EngineConfig(kind="quickstart-expert", model="quickstart-qwen3", options={"habit": "last"}))


def test_demonstrations_can_repeat_a_few_tasks() -> None:
    """`[warm_start] distinct_tasks`: the demonstrations cycle over that many training tasks,
    each repeated evenly; the default keeps every demonstration a different task."""
    from legorl.loop.config import WarmStartSection
    from legorl.loop.warm_start import demo_tasks

    train = family.tasks("train", 64, k=3)
    every = demo_tasks(train, 32, seed=0)
    assert len({t.instance_id for t in every}) == 32
    few = demo_tasks(train, 32, seed=0, distinct=8)
    counts = collections.Counter(t.instance_id for t in few)
    assert len(counts) == 8 and set(counts.values()) == {4}
    assert {t.instance_id for t in few} == {t.instance_id for t in every[:8]}  # the same shuffle, its head
    with pytest.raises(ValueError, match="distinct_tasks"):
        WarmStartSection(distinct_tasks=0)
