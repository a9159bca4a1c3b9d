"""`legorl train` on a real multi-node Ray cluster (tests/helpers/ray_cluster.py: `ray start` for a
head and two more nodes, all on 127.0.0.1): the driver — trainer and the served hf engine —
on the head, one rollout worker on each of the other nodes (placed by the custom resource
`worker_node`), and the node of worker 0 killed (SIGKILL to its raylet, object store, agents
and workers) while step 0's rollouts run. Its rollouts in flight must run again on the live
worker (or be masked, never rewarded), every rollout recorded once, and the run finish."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.helpers.loop_util import LEGORL, write_run
from tests.helpers.ray_cluster import ray_env, start_cluster

pytestmark = pytest.mark.slow


def events(db_path: Path, kind: str) -> list[dict]:
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
            return [json.loads(d) for (d,) in db.execute("SELECT data FROM events WHERE kind = ? ORDER BY id", (kind,))]
    except sqlite3.OperationalError:  # not created yet
        return []


@pytest.mark.timeout(600)
def test_a_lost_worker_node_reruns_its_rollouts_on_a_live_one(tmp_path: Path) -> None:
    with ExitStack() as stack:
        cluster = start_cluster(
            stack, {"engine_node": 1}, [{"worker_node": 1}, {"worker_node": 1}], head_cpus=1, worker_cpus=1
        )
        config = write_run(
            tmp_path,
            extra=f"""[ray]
enabled = true
address = "{cluster.address}"
workers = 2
num_cpus_per_worker = 0.5
worker_resources = {{ worker_node = 1 }}
""",
        )
        agent = tmp_path / "agent.sh"  # rollouts last long enough to be cut by the kill
        agent.write_text(agent.read_text().replace("\nif [", "\nsleep 8\nif [", 1))
        proc = subprocess.Popen(
            [*LEGORL, "train", str(config)],
            cwd=tmp_path,
            env=ray_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stack.callback(lambda: proc.poll() is None and proc.kill())
        db_path = tmp_path / "run" / "run.sqlite"
        deadline = time.monotonic() + 300
        while not (placed := events(db_path, "ray_placement")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert placed, proc.communicate(timeout=60)[1][-3000:] if proc.poll() is not None else "no placement in 300 s"
        first = placed[0]
        w0 = first["workers"][0]
        victim = next(n for n in cluster.nodes[1:] if n.runs(w0["pid"]))
        time.sleep(4)  # step 0's rollouts are inside their agents' sleep now
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
            ended = db.execute("SELECT t_end FROM steps WHERE step = 0").fetchone()
        victim.kill()
        _, err = proc.communicate(timeout=420)
    assert proc.returncode == 0, err[-4000:]
    assert ended is not None and ended[0] is None  # the kill landed mid-step
    # placement: the driver (trainer + served engine) on the engine node, a worker on each worker node
    nodes = first["nodes"]
    assert "engine_node" in nodes[first["driver_node_id"]]
    worker_nodes = [w["node_id"] for w in first["workers"]]
    assert len(set(worker_nodes)) == 2 and all("worker_node" in nodes[n] for n in worker_nodes)
    last = events(db_path, "ray_placement")[-1]
    assert last["lost"] == [0] and last["lost_rollouts"] >= 1, last
    with sqlite3.connect(db_path) as db:
        rows = db.execute("SELECT session_id, step, status, masked, reward, advantage FROM trajectories").fetchall()
    assert len(rows) == 2 * 4 and len({r[0] for r in rows}) == len(rows)  # each rollout recorded once
    assert sorted({r[1] for r in rows}) == [0, 1] and all(r[2] is not None for r in rows)
    for sid, step, status, masked, reward, advantage in rows:
        if status == "infra_error":  # nothing left to rerun it on: masked, never rewarded
            assert masked and reward == 0.0 and advantage is None, (sid, status)
        else:
            assert not masked and (step == 0 or "-w1-" in sid), sid  # step 1 ran on the live worker only
    rerun = [r for r in rows if r[0].endswith("-r1")]
    assert len(rerun) == last["lost_rollouts"] and all("-w1-" in r[0] and r[1] == 0 for r in rerun)
