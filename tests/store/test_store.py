"""Run store: token-exact round trips, deltas, filters, search, pagination, exports."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from legorl.monitor.demo import write_demo_run, write_session
from legorl.monitor.export import export_jsonl, export_parquet
from legorl.store import codec
from legorl.store.queries import compare_tasks
from legorl.store.run_store import RunStore
from legorl.types import AlignmentStats, Dialect, FinishReason, Outcome, Segment, Status, Trajectory, Turn, as_routing


def make_turn(sid: str, i: int, prompt: list[int], completion: list[int], request: dict, **kw) -> Turn:
    return Turn(
        session_id=sid,
        index=i,
        dialect=kw.pop("dialect", Dialect.OPENAI_CHAT),
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=[-0.25 * (k + 1) for k in range(len(completion))],
        finish_reason=FinishReason.STOP,
        sampling_used={"temperature": 1.0},
        request=request,
        **kw,
    )


def chat(*contents: str) -> dict:
    msgs = [{"role": "system", "content": "sys"}] + [
        {"role": "user" if k % 2 == 0 else "assistant", "content": c} for k, c in enumerate(contents)
    ]
    return {"model": "m", "messages": msgs, "tools": [{"type": "function", "function": {"name": "bash"}}]}


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    s = RunStore(tmp_path / "run", durable=False)  # fsync is not what these tests are about
    yield s
    s.close()


def test_turns_round_trip_token_exact_with_deltas_compaction_and_routing(store: RunStore, tmp_path: Path) -> None:
    routing = np.random.default_rng(0).integers(0, 128, size=(7, 3, 2)).tolist()
    turns = [
        make_turn("s", 0, [1, 2, 3], [4, 5], chat("fix it"), routed_experts=routing[:5]),
        make_turn(
            "s",
            1,
            [1, 2, 3, 4, 5, 6],
            [7],
            chat("fix it", "ok", "tool out"),
            routed_experts=routing[:7],
            tool_calls=[{"id": "c", "function": {"name": "bash", "arguments": "{}"}}],
        ),
        # compaction: the prompt no longer extends, the messages were rewritten, the system prompt changed
        make_turn("s", 2, [9, 9], [8, 8, 8], {**chat("summary"), "tools": []}, routed_experts=None),
        make_turn("s", 3, [9, 9, 8, 8, 8, 1], [2], {**chat("summary", "x", "y"), "tools": []}),
    ]
    for t in turns:
        store.add_turn(t)
    # a second writer (a restarted proxy) continues the session with a cold delta cache
    later = make_turn("s", 4, [9, 9, 8, 8, 8, 1, 2, 3], [4], {**chat("summary", "x", "y", "z", "w"), "tools": []})
    with RunStore(tmp_path / "run") as again:
        again.add_turn(later)
    turns.append(later)
    rows = {r["idx"]: r for r in store._conn.execute("SELECT idx, prompt_base, msg_base, request_rest FROM turns")}
    assert rows[1]["prompt_base"] == 5 and rows[1]["msg_base"] == 2 and rows[1]["request_rest"] is None
    assert rows[2]["prompt_base"] == 0 and rows[2]["request_rest"] is not None
    assert rows[4]["prompt_base"] == 7 and rows[4]["msg_base"] == 4
    got = RunStore(tmp_path / "run", readonly=True).load_turns("s")
    for want, have in zip(turns, got):
        assert have.prompt_ids == want.prompt_ids and have.completion_ids == want.completion_ids
        assert have.request == want.request and have.tool_calls == want.tool_calls
        assert (None if have.routed_experts is None else have.routed_experts.tolist()) == (
            None if want.routed_experts is None else as_routing(want.routed_experts).tolist()
        )
        assert np.allclose(have.logprobs, want.logprobs)
    assert len(got) == 5


def test_a_v1_store_is_migrated_and_keeps_trimmed_routing(tmp_path: Path) -> None:
    """Stores written before `routing_base` existed open, gain the column, and round-trip
    a turn whose routing starts past position 0."""
    import sqlite3

    with RunStore(tmp_path / "run") as s:
        s.add_turn(make_turn("old", 0, [1, 2], [3], chat("a")))
    conn = sqlite3.connect(tmp_path / "run" / "run.sqlite")
    with conn:
        conn.execute("ALTER TABLE turns DROP COLUMN routing_base")
        conn.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    conn.close()
    # a reader (the UI) opens it as it is, without migrating
    assert [t.routing_base for t in RunStore(tmp_path / "run", readonly=True).load_turns("old")] == [0]
    routing = [[[p % 8, (p + 1) % 8]] for p in range(6)]
    with RunStore(tmp_path / "run") as s:
        s.add_turn(make_turn("new", 0, [1, 2, 3], [4], chat("b"), routed_experts=as_routing(routing[:4])))
        s.add_turn(
            make_turn(
                "new",
                1,
                [1, 2, 3, 4, 5],
                [6],
                chat("b", "c", "d"),
                routed_experts=as_routing(routing[4:]),
                routing_base=4,
            )
        )
    again = RunStore(tmp_path / "run", readonly=True)
    assert [t.prompt_ids for t in again.load_turns("old")] == [[1, 2]]
    t0, t1 = again.load_turns("new")
    assert t0.routing_base == 0 and t1.routing_base == 4 and t1.routed_experts.tolist() == routing[4:]
    assert again._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "2"


def test_routing_codec_picks_smallest_dtype_and_rejects_bad_shapes() -> None:
    small = np.arange(24).reshape(2, 3, 4)
    big = small * 1000
    assert codec.unpack_routing(codec.pack_routing(small)).dtype == np.uint8
    assert (codec.unpack_routing(codec.pack_routing(big)) == big).all()
    with pytest.raises(ValueError, match="tokens, layers, top_k"):
        codec.pack_routing([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="rectangular"):
        codec.pack_routing([[[1]], [[1, 2]]])


def test_trajectory_outcome_advantage_and_trainer_logprobs(store: RunStore) -> None:
    store.add_turn(make_turn("s", 0, [1, 2], [3, 4], chat("a")), pieces=["x", "y"])
    store.add_turn(make_turn("s", 1, [1, 2, 3, 4, 5], [6], chat("a", "b", "c")))
    seg = Segment(
        turn_indices=[0, 1],
        token_ids=[1, 2, 3, 4, 5, 6],
        loss_mask=[0, 0, 1, 1, 0, 1],
        logprobs=[0, 0, -0.25, -0.5, 0, -0.25],
        policy_versions=[3] * 6,
    )
    store.add_trajectory(
        Trajectory("s", [seg], AlignmentStats(tokens=6, segments=1), instance_id="t1", harness="opencode", step=2)
    )
    assert store.list_trajectories(status="running")["total"] == 1
    out = Outcome(
        1.0,
        Status.RESOLVED,
        flags=["tamper_attempt"],
        tests={"a": "passed", "b": "failed"},
        evidence={"diff": "+fixed line\n", "exit_code": 0},
    )
    store.set_outcome("s", out)
    store.set_advantage("s", 0.75)
    store.set_segment_trainer_logprobs("s", 0, [0, 0, -0.3, -0.5, 0, -0.2])
    view = store.get_trajectory("s")
    assert view["status"] == "resolved" and view["advantage"] == 0.75 and view["flags"] == ["tamper_attempt"]
    assert view["outcome"]["diff"] == "+fixed line\n" and view["outcome"]["evidence"] == {"exit_code": 0}
    assert view["turns"][0]["pieces"] == ["x", "y"] and view["turns"][1]["pieces"] is None
    assert view["turns"][0]["trainer_logprobs"] == pytest.approx([-0.3, -0.5])
    assert view["turns"][1]["trainer_logprobs"] == pytest.approx([-0.2])
    assert [t["segment"] for t in view["turns"]] == [0, 0]
    store.set_trainer_logprobs("s", 1, [-0.9])
    assert store.get_trajectory("s")["turns"][1]["trainer_logprobs"] == pytest.approx([-0.9])
    traj = store.load_trajectory("s")
    assert traj.segments[0].token_ids == seg.token_ids and traj.segments[0].loss_mask == seg.loss_mask
    assert traj.outcome == out and traj.step == 2 and traj.harness == "opencode"


def test_bad_input_is_a_clear_error(store: RunStore, tmp_path: Path) -> None:
    t = make_turn("s", 0, [1], [2, 3], chat("a"))
    t.logprobs = [-1.0]
    with pytest.raises(ValueError, match="1 logprobs for 2 completion tokens"):
        store.add_turn(t)
    store.add_turn(make_turn("s", 0, [1], [2], chat("a")))
    with pytest.raises(ValueError, match="already recorded"):
        store.add_turn(make_turn("s", 0, [1], [2], chat("a")))
    with pytest.raises(ValueError, match="pieces"):
        store.add_turn(make_turn("s", 1, [1], [2], chat("a")), pieces=["a", "b"])
    with pytest.raises(ValueError, match="has 1 completion tokens"):
        store.set_trainer_logprobs("s", 0, [-1.0, -2.0])
    with pytest.raises(KeyError, match="no turn s#7"):
        store.set_trainer_logprobs("s", 7, [-1.0])
    with pytest.raises(ValueError, match="severity"):
        store.add_alert(0, "x", "fatal", "m")
    with pytest.raises(ValueError, match="must be a number"):
        store.log_metrics(0, {"reward/mean": "high"})
    with pytest.raises(FileNotFoundError, match="no run store"):
        RunStore(tmp_path / "nowhere", readonly=True)
    ro = RunStore(store.path.parent, readonly=True)
    with pytest.raises(PermissionError, match="readonly"):
        ro.log_metrics(0, {"a": 1})
    # a failed call leaves nothing half-written, and the store recovers from it
    assert store.get_trajectory("s")["n_turns"] == 1
    bad_seg = Segment(turn_indices=[0], token_ids=[1, 2], loss_mask=[0], logprobs=[0.0], policy_versions=[0])
    with pytest.raises(ValueError, match="lengths differ"):
        store.add_trajectory(Trajectory("fresh", [bad_seg], AlignmentStats()))
    assert store.get_trajectory("fresh") is None
    store.add_turn(make_turn("fresh", 0, [1], [2], chat("a")))
    assert store.get_trajectory("fresh")["n_turns"] == 1
    with pytest.raises(ValueError, match="turn index"):
        store.add_turn(make_turn("fresh", -1, [1], [2], chat("a")))


def test_filters_search_and_keyset_pagination(store: RunStore) -> None:
    trajs = write_demo_run(store, steps=2, tasks=3, group_size=4, seed=1)
    everything = store.list_trajectories(limit=1000)
    assert everything["total"] == len(trajs) == 24
    seen, cursor = [], None
    while True:
        page = store.list_trajectories(limit=5, cursor=cursor)
        seen += [r["session_id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [r["session_id"] for r in everything["items"]] and len(set(seen)) == 24
    by_status = {t.session_id for t in trajs if t.outcome.status == Status.RESOLVED}
    assert {r["session_id"] for r in store.list_trajectories(status="resolved", limit=100)["items"]} == by_status
    infra = {t.session_id for t in trajs if t.outcome.status.is_infra}
    assert {r["session_id"] for r in store.list_trajectories(status="infra", limit=100)["items"]} == infra
    flagged = {t.session_id for t in trajs if t.outcome.flags}
    assert {r["session_id"] for r in store.list_trajectories(flag="any", limit=100)["items"]} == flagged
    assert {r["session_id"] for r in store.list_trajectories(flag="tamper_attempt", limit=100)["items"]} == flagged
    combo = store.list_trajectories(step=1, harness="claude_code", task="astropy__astropy-12907", limit=100)["items"]
    assert combo and all(r["step"] == 1 and r["harness"] == "claude_code" for r in combo)
    assert all(r["reward"] >= 0.5 for r in store.list_trajectories(min_reward=0.5, limit=100)["items"])
    # full text: a tool output only some sessions saw, and the diff of graded ones
    store.add_turn(make_turn("needle-session", 0, [1], [2], chat("zanzibar_quux appears here")))
    hits = store.list_trajectories(q="zanzibar_quux")["items"]
    assert [r["session_id"] for r in hits] == ["needle-session"]
    assert store.list_trajectories(q='"unbalanced quote')["total"] == 0  # never an FTS syntax error
    assert store.list_trajectories(q="cright")["total"] == sum(bool(t.outcome.evidence.get("diff")) for t in trajs)
    with pytest.raises(ValueError, match="unknown status"):
        store.list_trajectories(status="bogus")
    with pytest.raises(ValueError, match="limit"):
        store.list_trajectories(limit=0)


def test_groups_metrics_alerts_and_compare(store: RunStore) -> None:
    trajs = write_demo_run(store, steps=3, tasks=2, group_size=4, seed=2)
    group = store.group(1, "astropy__astropy-12907")
    assert len(group) == 4 and all(r["step"] == 1 for r in group)
    graded = [r for r in group if not r["masked"]]
    varied = len({r["reward"] for r in graded}) > 1  # a zero-variance group is skipped: no advantages
    assert all((r["advantage"] is not None) == varied for r in graded)
    hist = store.metrics_history()
    assert [h["step"] for h in hist] == [0, 1, 2] and "reward/mean" in hist[0]
    store.log_metrics(2, {"reward/mean": 0.5})  # relogging a step: the last value wins
    assert store.metrics_history()[-1]["reward/mean"] == 0.5
    assert store.metrics(keys=["reward/mean"])["series"]["reward/mean"][-1] == (2, 0.5)
    store.add_event("checkpoint", {"path": "ckpt/2"}, step=2)
    assert store.events()[-1]["data"] == {"path": "ckpt/2"}
    a, b = store.task_stats(0), store.task_stats(2)
    cmp = compare_tasks(a, b)
    assert sum(cmp["counts"].values()) == len(cmp["tasks"]) == len(set(a) & set(b))
    for row in cmp["tasks"]:
        assert row["verdict"] == ("improved" if row["delta"] > 0 else "regressed" if row["delta"] < 0 else "same")
    del trajs


def test_exports_jsonl_and_parquet(store: RunStore, tmp_path: Path) -> None:
    rng = random.Random(3)
    t = write_session(
        store, rng, session_id="e1", step=0, task="t", harness="claude_code", dialect=Dialect.ANTHROPIC, p_resolve=1.0
    )
    store.log_metrics(0, {"reward/mean": 1.0})
    store.add_alert(0, "mismatch", "warning", "m")
    assert export_jsonl(store, tmp_path / "out.jsonl") == 1
    rec = json.loads((tmp_path / "out.jsonl").read_text())
    turns = store.load_turns("e1")
    assert [x["prompt_ids"] for x in rec["turns"]] == [x.prompt_ids for x in turns]
    assert rec["segments"][0]["token_ids"] == t.segments[0].token_ids and rec["turns"][0]["completion_pieces"]
    assert rec["outcome"]["status"] == t.outcome.status.value
    counts = export_parquet(store, tmp_path / "pq")
    assert counts == {"trajectories": 1, "turns": len(turns), "metrics": 1, "alerts": 1}
    table = pq.read_table(tmp_path / "pq" / "turns.parquet")
    assert table.column("completion_ids").to_pylist() == [x.completion_ids for x in turns]
    assert json.loads(table.column("request").to_pylist()[1]) == turns[1].request
    assert pq.read_table(tmp_path / "pq" / "trajectories.parquet").column("status").to_pylist() == [
        t.outcome.status.value
    ]


def test_abandoned_attempt_is_kept_apart_from_its_rerun(store: RunStore) -> None:
    """A resume re-runs an interrupted step: the first attempt's rollouts stay, flagged and
    detached, and never count in the re-run's group."""
    for step in (0, 1):
        store.begin_step(step)
        for k in range(2):
            sid = f"s{step}-{k}"
            store.start_session(sid, step=step, instance_id="t")
            store.set_outcome(sid, Outcome(1.0, Status.RESOLVED))
        store.log_metrics(step, {"reward/mean": 1.0})
    store.end_step(0)
    assert store.abandon_steps(1) == 2
    with store._read() as c:  # noqa: SLF001
        steps = dict(c.execute("SELECT session_id, step FROM trajectories"))
        flagged = {
            r[0]
            for r in c.execute(
                "SELECT t.session_id FROM flags f JOIN trajectories t ON t.id = f.traj_id WHERE f.flag = 'abandoned'"
            )
        }
        metric_steps = {r[0] for r in c.execute("SELECT DISTINCT step FROM metrics")}
    assert steps == {"s0-0": 0, "s0-1": 0, "s1-0": None, "s1-1": None}
    assert flagged == {"s1-0", "s1-1"} and metric_steps == {0}
