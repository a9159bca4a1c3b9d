"""What the UI reads from a user or a run directory: search text SQLite accepts, its own report file."""

from __future__ import annotations

import sqlite3

import pytest

from legorl.store.queries import fts_query


@pytest.mark.parametrize("text", ["a\x00b", '"', 'x" OR y', "NEAR(a b)", "\x00", "a*", "-a"])
def test_any_text_is_a_valid_query(text: str) -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE f USING fts5(x)")
    db.execute("INSERT INTO f VALUES ('a b x y')")
    query = fts_query(text)
    if query:
        db.execute("SELECT * FROM f WHERE f MATCH ?", (query,)).fetchall()


def test_a_nul_separates_words() -> None:
    assert fts_query("a\x00b") == '"a" "b"'


def test_the_ui_reads_the_run_s_own_heldout_report_never_a_link(tmp_path) -> None:
    from legorl.monitor.ui.server import RESULTS_FILE, heldout_report

    class NoEvents:
        def events(self, since: int, limit: int) -> list[dict]:
            return []

    secret = tmp_path / "host.json"
    secret.write_text('{"secret": 1}')
    run = tmp_path / "run"
    run.mkdir()
    (run / RESULTS_FILE).symlink_to(secret)
    assert heldout_report(run, NoEvents()) == {}  # type: ignore[arg-type]
    (run / RESULTS_FILE).unlink()
    (run / RESULTS_FILE).write_text('{"evaluations": []}')
    assert heldout_report(run, NoEvents()) == {"evaluations": []}  # type: ignore[arg-type]
