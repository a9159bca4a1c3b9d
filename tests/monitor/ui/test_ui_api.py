"""The UI's JSON API and live stream, against a real uvicorn server on loopback."""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from legorl.monitor.demo import write_demo_run, write_session
from legorl.monitor.ui.server import UIServerThread, serve_ui
from legorl.store.run_store import RunStore
from legorl.types import Dialect


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunStore, str]]:
    root = tmp_path_factory.mktemp("runs")
    store = RunStore(root / "run-a", durable=False)
    write_demo_run(store, steps=3, tasks=3, group_size=4, seed=5)
    other = RunStore(root / "run-b", durable=False)
    write_demo_run(other, steps=2, tasks=2, group_size=4, seed=6)
    with UIServerThread(root / "run-a", poll_interval=0.1, insecure=True) as srv:
        yield store, srv.url
    store.close()
    other.close()


CLIENT = httpx.Client(timeout=10)


def get(url: str, path: str, status: int = 200) -> dict:
    r = CLIENT.get(url + path)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def test_run_info_list_and_filters(run: tuple[RunStore, str]) -> None:
    store, url = run
    info = get(url, "api/run")
    assert info["trajectories"] == 36 and info["runs"] == ["run-a", "run-b"] and "reward/mean" in info["metric_keys"]
    assert info["metric_docs"]["mismatch/pearson"].startswith("Pearson")
    page = get(url, "api/trajectories?limit=10")
    assert len(page["items"]) == 10 and page["total"] == 36 and page["next_cursor"] is not None
    nxt = get(url, f"api/trajectories?limit=10&cursor={page['next_cursor']}")
    assert nxt["items"][0]["id"] < page["items"][-1]["id"]
    resolved = get(url, "api/trajectories?status=resolved&limit=100")
    assert resolved["items"] and all(r["status"] == "resolved" for r in resolved["items"])
    harness = get(url, "api/trajectories?harness=opencode&step=1&limit=100")["items"]
    assert harness and all(r["harness"] == "opencode" and r["step"] == 1 for r in harness)
    assert get(url, "api/trajectories?q=cright")["total"] > 0


def test_bad_requests_are_json_errors_naming_the_problem(run: tuple[RunStore, str]) -> None:
    _, url = run
    assert "unknown status 'nope'" in get(url, "api/trajectories?status=nope", 400)["error"]
    detail = get(url, "api/trajectories?limit=0", 422)["detail"]
    assert detail[0]["loc"] == ["query", "limit"]
    assert get(url, "api/trajectories?step=abc", 422)["detail"][0]["loc"] == ["query", "step"]
    assert "no trajectory" in get(url, "api/trajectories/does-not-exist", 404)["error"]
    assert "no run 'zzz'" in get(url, "api/compare?b_run=zzz", 404)["error"]
    assert get(url, "api/nothing-here", 404)["error"]


def test_trajectory_group_and_compare(run: tuple[RunStore, str]) -> None:
    store, url = run
    sid = get(url, "api/trajectories?status=resolved&limit=1")["items"][0]["session_id"]
    t = get(url, f"api/trajectories/{sid}")
    assert t["outcome"]["diff"].startswith("diff --git") and t["outcome"]["tests"]
    turn = t["turns"][0]
    assert len(turn["pieces"]) == len(turn["completion_ids"]) == len(turn["logprobs"]) == len(turn["trainer_logprobs"])
    assert turn["messages"][0]["role"] in ("system", "user")
    req = get(url, f"api/trajectories/{sid}/turns/{len(t['turns']) - 1}/request")
    assert req == store.load_turns(sid)[-1].request
    g = get(url, f"api/group?step={t['step']}&task={t['instance_id']}")
    assert sid in [r["session_id"] for r in g["trajectories"]] and len(g["trajectories"]) == 4
    groups = get(url, "api/groups?step=0")["tasks"]
    assert len(groups) == 3
    c = get(url, "api/compare?a_step=0&b_step=2")
    assert sum(c["counts"].values()) == 3
    cross = get(url, "api/compare?b_run=run-b")
    assert len(cross["tasks"]) == 2 and len(cross["only_a"]) == 1  # run-b has two of run-a's three tasks


def test_stream_pushes_new_trajectories_metrics_and_alerts(run: tuple[RunStore, str]) -> None:
    store, url = run
    seen: dict[str, list[dict]] = {}

    def live_rows() -> list[dict]:
        return [t for t in seen.get("trajectory", []) if t["session_id"] == "live-1"]

    # each stage writes once the stream has shown the previous one
    stages = [
        (lambda: "hello" in seen, lambda: store.start_session("live-1", step=3, instance_id="astropy__astropy-12907")),
        (
            lambda: any(t["status"] is None for t in live_rows()),  # a running, ungraded session shows up
            lambda: write_session(
                store,
                random.Random(9),
                session_id="live-2",
                step=3,
                task="astropy__astropy-12907",
                harness="claude_code",
                dialect=Dialect.ANTHROPIC,
                p_resolve=1.0,
            ),
        ),
        (
            lambda: any(t["session_id"] == "live-2" and t["status"] for t in seen.get("trajectory", [])),
            lambda: (
                store.log_metrics(3, {"reward/mean": 0.9}),
                store.add_alert(3, "reward_flat", "info", "just a test"),
            ),
        ),
        (lambda: "alert" in seen and "metrics" in seen, None),
    ]
    with CLIENT.stream("GET", url + "api/stream", timeout=20) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        event, deadline = None, time.monotonic() + 15
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                seen.setdefault(event or "", []).append(json.loads(line[6:]))
            while stages and stages[0][0]():
                _, action = stages.pop(0)
                if action is not None:
                    action()
            if not stages:
                break
            assert time.monotonic() < deadline, f"stream did not deliver in time: {list(seen)}"
    assert seen["metrics"][-1]["series"]["reward/mean"] == [[3, 0.9]]
    assert seen["alert"][-1]["message"] == "just a test"
    assert [t["n_turns"] for t in seen["trajectory"] if t["session_id"] == "live-2"][-1] >= 2


def test_serve_ui_refuses_missing_store_and_busy_port(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no run store"):
        serve_ui(tmp_path / "nothing", "127.0.0.1", 0)
    RunStore(tmp_path / "r").close()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(SystemExit, match="choose another --port"):
            serve_ui(tmp_path / "r", "127.0.0.1", busy.getsockname()[1])


def test_app_mounts_under_a_prefix_in_another_server(run: tuple[RunStore, str]) -> None:
    """`legorl train` mounts the UI into its own app: relative URLs must keep working."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from legorl.monitor.ui.server import make_ui_app

    store, _ = run
    parent = FastAPI()
    parent.mount("/ui", make_ui_app(store.path.parent))
    with TestClient(parent) as client:
        page = client.get("/ui/")
        assert page.status_code == 200 and 'src="static/app.js"' in page.text
        assert client.get("/ui/static/app.js").status_code == 200
        assert client.get("/ui/api/run").json()["trajectories"] >= 36
        assert client.get("/ui", follow_redirects=False).status_code in (307, 308)


@pytest.fixture(scope="module")
def phased(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunStore, str]]:
    """A finished run with the phases `legorl train` has before GSPO and its held-out report."""
    store = RunStore(tmp_path_factory.mktemp("runs") / "phased", durable=False)
    write_demo_run(store, steps=3, tasks=3, group_size=4, seed=5, phases=True)
    with UIServerThread(store.path.parent, poll_interval=0.1, insecure=True) as srv:
        yield store, srv.url
    store.close()


def test_phases_are_named_and_steps_are_gspo_steps(phased: tuple[RunStore, str]) -> None:
    _, url = phased
    info = get(url, "api/run")
    assert (info["first_step"], info["last_step"]) == (0, 2)  # not -2: those are phases
    assert [(p["step"], p["name"], p["trajectories"]) for p in info["phases"]] == [
        (-2, "held-out evaluation", 3),
        (-1, "warm start", 3),
    ]
    ev = get(url, "api/trajectories/eval-start-00")
    assert ev["phase"] == "held-out evaluation" and ev["untrained"] == "held-out evaluation: scored, never trained"
    assert get(url, "api/trajectories/demo-00")["phase"] == "warm start"
    assert info["info"]["action_formats"]["mini_swe_agent"]["label"] == "a bash tool call in every turn"


def test_a_zero_variance_trajectory_says_why_it_has_no_advantage(phased: tuple[RunStore, str]) -> None:
    store, url = phased
    trained, skipped = [], []
    for step in range(3):
        for task, stats in store.task_stats(step).items():
            rows = [r for r in store.group(step, task) if r["status"] and not r["masked"]]
            (skipped if stats["reward_var"] == 0 else trained).append(rows[0]["session_id"])
    assert skipped and trained, "the demo run should have both kinds of group"
    t = get(url, f"api/trajectories/{skipped[0]}")
    assert t["advantage"] is None
    assert t["untrained"].startswith("group skipped: zero variance (") and t["untrained"].endswith("), not trained")
    t = get(url, f"api/trajectories/{trained[0]}")
    assert t["advantage"] is not None and t["untrained"] is None
    store.start_session("running-1", step=2, instance_id="astropy__astropy-12907")
    assert get(url, "api/trajectories/running-1")["untrained"] == "not graded yet"


def test_heldout_table_comes_from_the_results_file_or_the_store(phased: tuple[RunStore, str]) -> None:
    store, url = phased
    rep = get(url, "api/heldout")
    assert list(rep["evaluations"]) == ["start", "warm_start", "end", "control"]
    end = rep["evaluations"]["end"]
    assert (end["resolved"], end["episodes"], end["resolved_rate"]) == (154, 200, 0.77)
    assert end["ci95"][0] < 0.77 < end["ci95"][1]
    assert (
        rep["gains"]["gspo_over_warm_start"]["points"] == 32.5 and rep["gains"]["gspo_over_warm_start"]["ci95"][0] > 0
    )
    results = store.path.parent / "heldout_results.json"
    results.rename(results.with_suffix(".moved"))  # a store copied without its run directory
    try:
        assert get(url, "api/heldout") == rep  # the store's `heldout` event
    finally:
        results.with_suffix(".moved").rename(results)
    from fastapi.testclient import TestClient

    from legorl.monitor.ui.server import make_ui_app

    RunStore(store.path.parent.parent / "fresh").close()
    with TestClient(make_ui_app(store.path.parent.parent / "fresh")) as client:
        assert client.get("/api/heldout").json() == {}  # before the first evaluation
