"""The live UI in a real headless Chromium (Debian's, driven by Playwright; see scripts/setup_ui.sh).

On a run written through the store API: the overview draws its charts, heads with the
held-out table and names the phases before GSPO, a trajectory page shows coloured tokens
and the diff (and why a skipped group's trajectory has no advantage), a filter narrows the
list, and a trajectory written while the page is open appears without a reload. (The
README's screenshots are of a real run: scripts/ui_screenshots.py.)
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from legorl.monitor.demo import write_demo_run, write_session
from legorl.monitor.ui.server import UIServerThread
from legorl.store.run_store import RunStore
from legorl.types import Dialect
from tests.helpers.browser import open_page


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunStore, str]]:
    run_dir = tmp_path_factory.mktemp("runs") / "demo-run"
    store = RunStore(run_dir, durable=False)
    write_demo_run(store, steps=8, tasks=4, group_size=4, seed=0, phases=True)
    with UIServerThread(run_dir, poll_interval=0.2) as srv:
        yield store, srv.url
    store.close()


def test_overview_draws_the_rl_charts(ui: tuple[RunStore, str], page: object, tmp_path: Path) -> None:
    _, url = ui
    open_page(page, url)
    for title in (
        "Reward & resolved rate",
        "Rollout/trainer prob correlation",
        "Clip fraction",
        "Entropy",
        "Turns (mean)",
        "Tool use",
        "Failure classes (share of rollouts)",
    ):
        chart = page.locator(f".chart[data-title='{title}']")
        assert chart.locator("path.line").count() >= 1, f"chart {title!r} has no line"
        d = chart.locator("path.line").first.get_attribute("d")
        assert d.count("L") >= 7, f"chart {title!r} does not span the 8 steps"
    assert page.locator("table.alerts tr.sev-warning").count() >= 1  # the demo's mismatch dip raised one
    assert page.locator(".chart[data-title='Rollout/trainer prob correlation'] line.mark").count() >= 1
    assert page.screenshot(path=str(tmp_path / "ui-overview.png"))  # the page renders to an image


def test_overview_heads_with_the_heldout_table_and_names_the_phases(ui: tuple[RunStore, str], page: object) -> None:
    _, url = ui
    open_page(page, url)
    page.wait_for_selector("table.heldout-table tr[data-label='end']")
    rows = page.eval_on_selector_all(
        "table.heldout-table tr[data-label]", "els => els.map(e => [...e.children].map(c => c.textContent))"
    )
    assert [r[0] for r in rows] == [
        "start (untrained)",
        "warm start",
        "end (after GSPO)",
        "control (more SFT instead of GSPO)",
    ]
    assert rows[2][1:4] == ["77.0%", "[70.7%, 82.3%]", "154/200"]
    gain = page.locator("ul.gains li[data-gain='gspo_over_warm_start']").text_content()
    assert gain.startswith("GSPO over its warm start: +32.5 points [+") and "interval above 0" in gain
    cards = page.locator(".cards").text_content()
    assert "0–7GSPO steps" in cards and "held-out evaluation · warm start" in cards and "−" not in cards
    assert "-2" not in page.locator(".card.steps").text_content()
    chart = page.locator(".chart[data-title='Parse failures (share of turns)']")
    assert chart.locator("path.line").count() == 5  # overall and each of the demo's four harnesses
    assert "mini_swe_agent" in chart.locator(".legend").text_content()
    assert chart.locator("line.ref").count() == 1  # the [monitor] threshold
    doc = chart.locator(".chart-title").get_attribute("title")
    assert "rollout/parse_failure_rate/mini_swe_agent: the same, for one harness of the run" in doc
    assert "mini_swe_agent: a bash tool call in every turn" in page.locator("p.formats").text_content()


def test_a_skipped_groups_trajectory_says_why_it_has_no_advantage(ui: tuple[RunStore, str], page: object) -> None:
    store, url = ui
    sid = next(
        r["session_id"]
        for step in range(8)
        for task, stats in store.task_stats(step).items()
        if stats["reward_var"] == 0
        for r in store.group(step, task)
        if r["status"] and not r["masked"]
    )
    open_page(page, f"{url}#/t/{sid}")
    page.wait_for_selector("p.untrained")
    note = page.locator("p.untrained").text_content()
    assert note.startswith("no advantage group skipped: zero variance (") and note.endswith("not trained")
    assert "advantagenone" in page.locator(".thead .kv").text_content()
    open_page(page, f"{url}#/t/eval-start-00")
    page.wait_for_selector("p.untrained")
    assert "held-out evaluation: scored, never trained" in page.locator("p.untrained").text_content()
    assert "phaseheld-out evaluation" in page.locator(".thead .kv").text_content()


def test_trajectory_page_shows_coloured_tokens_segments_and_diff(
    ui: tuple[RunStore, str], page: object, tmp_path: Path
) -> None:
    store, url = ui
    resolved = store.list_trajectories(status="resolved", limit=200)["items"]
    sid = max(resolved, key=lambda r: r["n_turns"])["session_id"]
    open_page(page, f"{url}#/t/{sid}")
    page.wait_for_selector(".tokens .tok")
    view = store.get_trajectory(sid)
    n_tokens = sum(t["n_completion"] for t in view["turns"])
    assert page.locator(".tokens .tok").count() == n_tokens
    first = page.locator(".turn").first.locator(".tok").first
    assert first.text_content() == view["turns"][0]["pieces"][0]
    coloured = page.eval_on_selector_all(".tokens .tok", "els => els.filter(e => e.style.background).length")
    assert coloured == n_tokens
    assert page.locator(".segment-start").count() == view["n_segments"]
    assert page.locator("pre.diff .dl.add").count() >= 1 and "cright" in page.locator("pre.diff").text_content()
    assert page.locator("table.tests .t-passed").count() >= 1
    assert page.locator(".msg.m-tool_result").count() >= 1  # tool outputs as the harness sent them
    assert page.screenshot(path=str(tmp_path / "ui-trajectory.png"))
    rollout_bg = first.evaluate("e => e.style.background")
    page.click("button[data-mode=diff]")
    page.wait_for_selector(".tokens[data-mode=diff]")
    diff_bg = page.locator(".turn").first.locator(".tok").first.evaluate("e => e.style.background")
    assert diff_bg != rollout_bg  # a different colouring, from the trainer logprobs


def test_filter_narrows_the_list(ui: tuple[RunStore, str], page: object) -> None:
    store, url = ui
    open_page(page, f"{url}#/trajectories")
    page.wait_for_selector("table.trajs tr.row")
    total = store.list_trajectories()["total"]
    assert page.locator(".list-info").text_content().startswith(f"{total} matching")
    page.select_option("select[name=status]", "resolved")
    n_resolved = store.list_trajectories(status="resolved")["total"]
    page.wait_for_function(f"document.querySelector('.list-info').textContent.startsWith('{n_resolved} matching')")
    statuses = page.eval_on_selector_all(
        "table.trajs tr.row .badge[class*='st-']", "els => els.map(e => e.textContent)"
    )
    assert statuses and set(statuses) == {"resolved"} and n_resolved < total
    page.fill("input[name=q]", "cright")
    page.press("input[name=q]", "Enter")
    n_q = store.list_trajectories(status="resolved", q="cright")["total"]
    page.wait_for_function(
        f"location.hash.includes('q=cright') && "
        f"document.querySelector('.list-info').textContent.startsWith('{n_q} matching')"
    )


def test_a_new_trajectory_appears_without_reload(ui: tuple[RunStore, str], page: object) -> None:
    store, url = ui
    open_page(page, f"{url}#/trajectories")
    page.wait_for_selector("table.trajs tr.row")
    page.evaluate("window.__same_document = true")
    write_session(
        store,
        random.Random(42),
        session_id="live-session",
        step=8,
        task="astropy__astropy-12907",
        harness="claude_code",
        dialect=Dialect.ANTHROPIC,
        p_resolve=1.0,
    )
    page.wait_for_selector("tr.row[data-sid='live-session']")
    assert page.evaluate("window.__same_document") is True
    # and its page follows the session live too: a new turn shows up in the open trajectory view
    page.click("tr.row[data-sid='live-session'] a")
    page.wait_for_selector(".turn")
    n = page.locator(".turn").count()
    from legorl.monitor.demo import encode
    from legorl.types import FinishReason, Turn

    ids, pieces = encode("One more look at the tests.")
    store.add_turn(
        Turn(
            session_id="live-session",
            index=n,
            dialect=Dialect.ANTHROPIC,
            prompt_ids=[1, 2],
            completion_ids=ids,
            logprobs=[-0.1] * len(ids),
            finish_reason=FinishReason.STOP,
            sampling_used={},
            request={"messages": [{"role": "user", "content": "go on"}]},
        ),
        pieces=pieces,
    )
    page.wait_for_selector(f".turn[data-turn='{n}']")
    assert page.evaluate("window.__same_document") is True
