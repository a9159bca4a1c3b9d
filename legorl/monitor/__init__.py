"""Observability over the run store: monitors, pre-flight, exports and the live UI.

The database of record itself is `legorl.store` (`RunStore`); everything here reads it.
Start here: `monitors.py` raises alerts from the metric history (`sinks.py` mirrors metrics
to trackers); `doctor.py` is the pre-flight framework (the checks themselves are
registered by each component, run by `loop/preflight.py`); `export.py` writes JSONL or
Parquet and `atif.py` ATIF trajectories; `demo.py` writes a synthetic run for demos and benches; `ui/` is the live UI.
"""
