"""The live run UI (`legorl ui --run DIR`).

Start here: `server.py` (a JSON API over a read-only run store, server-sent events for
live updates, and the static page in `static/`: plain HTML, JS and CSS, no build step).
"""
