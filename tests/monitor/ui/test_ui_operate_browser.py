"""The UI's status page and solve grid (issue 38, item 6) in a real headless Chromium, on a
real `legorl train` run's store. The status page is `legorl status` live: a healthy run says
"no known signature matched"; a copy made sick through the store API names its signature with
the evidence read and the fix; a signature that starts matching while the page is open
appears without a reload. The solve grid has one cell per group, coloured by its resolved
share as the store counts it, and a click opens that group.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from legorl.monitor.ui.server import UIServerThread
from legorl.ops.status import NO_MATCH
from legorl.store.run_store import RunStore
from legorl.types import Outcome, Status
from tests.helpers.browser import open_page
from tests.helpers.loop_util import train, write_run
from tests.helpers.sick_runs import HEALTHY_STEP, SICK, copy_store, sick_store


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("run")
    proc = train(write_run(tmp))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


def served(run: Path) -> UIServerThread:
    return UIServerThread(run, poll_interval=0.2)


def test_a_healthy_run_matches_no_signature(healthy: Path, page: object) -> None:  # noqa: F811
    with served(healthy) as srv:
        open_page(page, srv.url + "#/status")
        page.wait_for_selector("#status h2")
        assert page.inner_text("#status h2") == NO_MATCH
        assert page.inner_text("[data-k='steps'] .v") == "2/2"
        assert page.inner_text("[data-k='state'] .v") == "finished"
        assert page.query_selector_all("#status .signature") == []
        assert page.get_attribute("nav a.active", "data-page") == "status"


def test_a_sick_run_names_its_signature_with_evidence(healthy: Path, page: object, tmp_path: Path) -> None:  # noqa: F811
    run = sick_store(healthy, tmp_path / "sick", SICK["infra_avalanche"])
    with served(run) as srv:
        open_page(page, srv.url + "#/status")
        sig = page.wait_for_selector("#status [data-signature='infra_avalanche']")
        title = sig.query_selector("h3").inner_text()
        assert "infrastructure avalanche" in title and "critical" in title
        evidence = [e.inner_text() for e in sig.query_selector_all(".evidence")]
        assert any("step 4: 60%" in e for e in evidence) and "fix:" in sig.query_selector(".fix").inner_text()
        assert page.inner_text("#status h2") == "Sick: infrastructure avalanche"


def test_a_signature_appears_live(healthy: Path, page: object, tmp_path: Path) -> None:  # noqa: F811
    run = copy_store(healthy, tmp_path / "live")
    with served(run) as srv:
        open_page(page, srv.url + "#/status")
        page.wait_for_selector("#status h2")
        assert page.query_selector_all("#status .signature") == []
        with RunStore(run) as store:  # the trainer writes two steps at lr 0
            for step in (2, 3):
                store.log_metrics(step, {**HEALTHY_STEP, "train/lr": 0.0})
        page.wait_for_selector("#status [data-signature='lr_zero']", timeout=20_000)
        assert page.inner_text("#status h2") == "Sick: learning rate 0"


def test_the_solve_grid_has_one_cell_per_group_and_opens_it(healthy: Path, page: object) -> None:  # noqa: F811
    with RunStore(healthy, readonly=True) as store:
        groups = {(s["step"], task): t for s in store.steps() for task, t in store.task_stats(s["step"]).items()}
    with served(healthy) as srv:
        open_page(page, srv.url + "#/grid")
        page.wait_for_selector(".solve-grid")
        cells = page.query_selector_all(".solve-grid td.cell:not(.empty)")
        got = {
            (int(c.get_attribute("data-step")), c.evaluate("e => e.parentElement.dataset.task")): float(
                c.get_attribute("data-resolved")
            )
            for c in cells
        }
        assert got == {k: t["resolved_rate"] for k, t in groups.items()}
        step, task = sorted(groups)[0]
        page.click(f".solve-grid tr[data-task='{task}'] td[data-step='{step}'] a")
        page.wait_for_function("location.hash.startsWith('#/group?')")
        assert f"step={step}" in page.evaluate("location.hash") and task in page.evaluate(
            "decodeURIComponent(location.hash)"
        )
        page.wait_for_selector("main h2, main table")
        assert task in page.inner_text("main")


def test_the_outcomes_view_says_what_each_rollout_gave_and_why(healthy: Path, page: object, tmp_path: Path) -> None:  # noqa: F811
    """The real run's step 1 (every group zero-variance: its agent never lands the fix), then a
    copy where, through the store API, one rollout is masked as an infrastructure fault and two
    carry advantages (as a trainer would write them)."""
    with served(healthy) as srv:
        open_page(page, srv.url + "#/outcomes?step=1")
        page.wait_for_selector("#outcomes table.outcomes")
        rows = page.query_selector_all("#outcomes tr[data-kind]")
        assert rows and all(r.get_attribute("data-kind") == "zero_variance" for r in rows)
        assert "every graded rollout of its group scored 0" in rows[0].inner_text()
    run = copy_store(healthy, tmp_path / "mixed")
    with RunStore(run) as store:
        sids = [t["session_id"] for t in store.list_trajectories(step=1, limit=50, order="asc")["items"]]
        store.set_outcome(sids[0], Outcome(reward=0.0, status=Status.INFRA_ERROR, masked=True))
        store.set_advantages({sids[1]: 0.75, sids[2]: -0.75})
    with served(run) as srv:
        open_page(page, srv.url + "#/outcomes?step=1")
        page.wait_for_selector("#outcomes table.outcomes")
        kinds = {
            r.get_attribute("data-session"): r.get_attribute("data-kind")
            for r in page.query_selector_all("#outcomes tr[data-kind]")
        }
        assert kinds[sids[0]] == "masked" and kinds[sids[1]] == kinds[sids[2]] == "gradient"
        assert page.inner_text("#outcomes .card[data-kind='gradient'] .v") == "2"
        assert page.inner_text("#outcomes .card[data-kind='masked'] .v") == "1"
        assert "advantage +0.75" in page.inner_text(f"#outcomes tr[data-session='{sids[1]}']")
        assert "infrastructure" in page.inner_text(f"#outcomes tr[data-session='{sids[0]}']")
