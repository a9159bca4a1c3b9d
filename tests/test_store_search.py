"""The UI's search text becomes an FTS5 query that SQLite always accepts."""

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
