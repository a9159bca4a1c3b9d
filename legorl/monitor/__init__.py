"""Observability: the run store (the database of record), monitors, pre-flight and the UI.

Start here: `store.py` (`RunStore`: every turn, trajectory, outcome, metric and alert,
committed before anything is trained on it), with `schema.py` (its SQLite tables),
`codec.py` (token arrays as bytes), `rebuild.py` (delta rows → full turns) and
`queries.py` (the read side). `monitors.py` raises alerts from the metric history;
`doctor.py` is the pre-flight framework (the checks themselves are `loop/preflight.py`);
`export.py` writes JSONL or Parquet; `messages.py` turns raw requests into display
messages; `demo.py` writes a synthetic run for demos and benches; `ui/` is the live UI.
"""
