"""`RunStore.abandon_attempt`: what a resume keeps and what it redoes, on a store by hand.

A resume at step s redoes GSPO steps >= s and every held-out evaluation its checkpoint does
not record as done; their rollouts are kept, flagged `abandoned` and detached from their
step, and their metrics cleared, so the redone attempt counts once. The evaluations that
are done keep their rollouts and their `heldout/<label>/…` metrics, whatever step those
were logged at (a redone step's metrics go; its held-out ones do not, unless redone).
"""

from __future__ import annotations

from pathlib import Path

from legorl.store.phase_steps import HELDOUT_STEP, WARM_START_STEP, eval_phase, eval_session_tag
from legorl.store.run_store import RunStore


def _session(store: RunStore, sid: str, step: int) -> None:
    store.start_session(sid, step=step, instance_id="t")


def test_a_resume_abandons_the_redone_steps_and_evaluations_only(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        _session(store, "demo-t-0-aa", WARM_START_STEP)
        for phase in ("warm_start", "end", "end@opencode"):
            _session(store, f"{eval_session_tag(phase)}-t-0-bb", HELDOUT_STEP)
            store.log_metrics(2, {f"heldout/{phase}/episodes": 1.0})
        for step in (0, 1, 2):
            _session(store, f"s{step}-t-0-cc", step)
            store.log_metrics(step, {"reward/mean": 0.5})
        store.log_metrics(0, {"heldout/warm_start/resolved_rate": 0.25})

        assert store.abandon_attempt(2, heldout_kept={"start", "warm_start"}) == 3  # step 2, end, end@opencode
        with store._read() as c:
            steps = dict(c.execute("SELECT session_id, step FROM trajectories").fetchall())
            flagged = {r[0] for r in c.execute("SELECT traj_id FROM flags WHERE flag = 'abandoned'")}
            keys = {(r[0], r[1]) for r in c.execute("SELECT step, key FROM metrics")}
        assert (
            steps["s2-t-0-cc"] is None
            and steps["eval-end-t-0-bb"] is None
            and steps["eval-end-opencode-t-0-bb"] is None
        )
        assert steps["eval-warm_start-t-0-bb"] == HELDOUT_STEP and steps["s1-t-0-cc"] == 1
        assert steps["demo-t-0-aa"] == WARM_START_STEP and len(flagged) == 3
        assert keys == {
            (0, "reward/mean"),
            (1, "reward/mean"),
            (2, "heldout/warm_start/episodes"),  # done before the checkpoint: kept although logged at step 2
            (0, "heldout/warm_start/resolved_rate"),
        }, keys
        assert store.abandon_steps(0) == 2  # steps 0 and 1; every evaluation kept
        assert store.abandon_attempt(0, heldout_kept=set(), warm_start=True) == 2  # the demo and warm_start


def test_evaluation_phases_are_told_apart_by_session_id() -> None:
    assert eval_phase("eval-warm_start-calc-1-0-ab12cd") == "warm_start"
    assert eval_phase("eval-start-mini-swe-agent-calc-1-0-ab12cd") == "start"
    assert eval_phase("eval-end-calc-1-0-ab12cd") == "end" and eval_phase("eval-control-x-0-ab") == "control"
    assert eval_phase("s3-calc-1-0-ab12cd") is None and eval_phase("eval-endless-x") is None
