"""The run store: the database of record of a run (SQLite, append-only, crash-safe).

Every turn, trajectory, outcome, metric and alert is committed here before anything is
trained on it, and everything the UI, the monitors and the exports show is read from here.

Start here:

    from legorl.store.run_store import RunStore

    store = RunStore(run_dir)                   # the writer: one per process, thread-safe
    store.add_turn(turn, pieces=[...])          # as the proxy records it
    store.add_trajectory(trajectory)            # segments (+ outcome if graded)
    reader = RunStore(run_dir, readonly=True)   # the UI's side; WAL lets it read during training

Modules: run_store.py (`RunStore`, the write side, and the transaction rule), schema.py (its
SQLite tables, `db_path`), codec.py (token arrays as bytes), rebuild.py (delta rows -> full
turns), queries.py (the read side, `StoreQueries`), messages.py (raw requests of the three
API dialects -> the display messages the store indexes), phase_steps.py (the steps that are
phases of a run, not GSPO steps). Nothing here imports `legorl.monitor`: the monitors, the
exports and the UI read the store, never the other way round.
"""
