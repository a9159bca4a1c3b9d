"""A grading run of a repository's own test runner (Django's `tests/runtests.py`, SymPy's
`bin/test`) as it executes inside the sandbox (the image's Python; never imports legorl).

The same design as the pytest supervisor (`pytest_main.py`; this file imports the modules
beside it, all but the pytest recorder): the supervisor reads and deletes its configuration,
plants the canaries among the task's own tests, hashes the task's test files, then forks. The
child installs a *recorder* (`lg_native_recorder.py`) at the innermost call of each test before
the repository is importable, then runs the runner's script (`runpy`) with its output on a pipe
to the supervisor, so nothing written after it can replace the log (only append to it).

The recorder is the channel the runner's log cannot forge: code under test can print
`test_x ... ok`, but the record of what `test_x` raised is HMAC-tagged on a pipe whose
key it never sees. Per runner:
- `unittest` (Django): `unittest.case.TestCase._callSetUp/_callTestMethod/_callTearDown`
  are wrapped (every TestCase runs through them), and `TestCase.run` sends the record;
- `sympy`: the runner `exec`s each test file into a dict and then calls its `test_*`
  functions; the builtin `exec` is wrapped so that, for the task's test files, each test
  function in that dict is replaced by a recording wrapper (`functools.wraps`: the
  runner's sorting by source line and its `_slow` marks see the original).
At the end the child diffs a snapshot of unittest's machinery and of the wrapped builtins
(`changed_since`), and checks that its wrappers are still in place.

Usage: `python -I -B native_main.py CONFIG.json`.
"""

import hashlib
import json
import os
import sys
import time

# The supervisor's modules lie beside this file; `python -I` leaves its folder off the path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg_compiles import FreshCompiles
from lg_native_recorder import record_sympy, record_unittest, sender
from lg_probes import probe_comparisons
from lg_snapshot import WATCH_ATTRS, WATCH_MODULES, changed_since, digests, snapshot
from lg_supervise import (
    SETUP_FAILED,
    child_stdio,
    collect,
    plant_or_stop,
    subreaper,
    undumpable,
    verified_records,
    write_summary,
)
from lg_watch import Watch

del sys.path[0]  # and off it again: the code under test sees the path `python -I` made

# What the snapshot watches besides pytest's: the result classes that print the log, and the
# builtins the SymPy recorder wraps.
NATIVE_MODULES = WATCH_MODULES + ("unittest.runner", "unittest.suite", "unittest.loader")
NATIVE_ATTRS = dict(WATCH_ATTRS, builtins=("open", "__import__", "exec", "compile", "__lg_probe__"))


def child(cfg, key, rec_w, log_w, go_r):
    """Run the runner's script with the recorder once the supervisor says go; never returns.
    Everything up to the go happens before the repository is on `sys.path`."""
    _exit = os._exit
    started_ns = time.time_ns()
    child_stdio(log_w)
    import_watched()
    send = sender(key, rec_w)
    repo = cfg["repo"].rstrip("/") + "/"
    watch = Watch(repo, cfg.get("agent_files", []), cfg.get("test_files", []), started_ns, sys._getframe)
    if cfg["runner"] == "unittest":
        wrappers, owner = record_unittest(watch, send)
    else:  # sympy
        wrappers, owner = record_sympy(watch, send, repo, {repo + p for p in cfg["test_files"]})
    watch.wrap_threads()
    snap = snapshot(sys.modules, NATIVE_MODULES, NATIVE_ATTRS)
    watch.install()  # after the snapshot, before any repository code
    set_warnings(cfg.get("warnings", []))

    def own_changes():
        return ["recorder." + n for n, fn in wrappers.items() if getattr(owner, n, None) is not fn]

    if os.read(go_r, 1) != b"1":
        _exit(SETUP_FAILED)
    os.close(go_r)
    code = run_script(cfg, repo)
    try:
        import threading

        send(
            "end",
            changed=changed_since(snap, sys.modules, repo, started_ns, watch.origins) + own_changes(),
            hooks=watch.hooks_now(threading),
            events=list(watch.events),
            exitstatus=code,
        )
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        _exit(code if 0 <= code < 256 else 1)


def import_watched():
    """unittest's machinery (and what the snapshot watches), imported before the repository is importable."""
    import unittest  # noqa: F401
    import unittest.case  # noqa: F401
    import unittest.loader  # noqa: F401
    import unittest.result  # noqa: F401
    import unittest.runner  # noqa: F401
    import unittest.suite  # noqa: F401
    import warnings  # noqa: F401
    import xml.etree.ElementTree  # noqa: F401  (watched by the snapshot, as for pytest)


def set_warnings(options):
    """PYTHONWARNINGS, which `python -I` ignores."""
    import warnings

    for opt in options:
        try:
            warnings._setoption(opt)
        except warnings._OptionError:
            pass


def run_script(cfg, repo):
    """Run the runner's script as `__main__` with its arguments; its exit status."""
    script = repo + cfg["script"]
    sys.path.insert(0, os.path.dirname(script))
    sys.path.append(repo[:-1])
    sys.argv = [script] + list(cfg["args"])
    cfg.clear()
    code = 0
    try:
        import runpy

        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        c = exc.code
        code = c if isinstance(c, int) else (0 if c is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 3
    return code


def main():
    cfg_path = sys.argv[1]
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    os.unlink(cfg_path)
    nonce, key = cfg.pop("nonce"), bytes.fromhex(cfg.pop("key"))
    summary_path = cfg.pop("summary", None)  # like the nonce, never the child's to know
    spec = cfg.pop("plant")
    wanted = set(cfg.pop("wanted", None) or ())
    rec_r, rec_w = os.pipe()
    log_r, log_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            nonce = wanted = summary_path = None  # noqa: F841
            for fd in (rec_r, log_r, go_w):
                os.close(fd)
            child(cfg, key, rec_w, log_w, go_r)
        finally:
            os._exit(3)
    for fd in (rec_w, log_w, go_r):
        os.close(fd)
    subreaper()
    undumpable()
    guard = [cfg["repo"].rstrip("/") + "/" + p for p in cfg.get("guard", [])]
    canaries = plant_or_stop(pid, spec, nonce)
    if canaries and spec.get("ids"):  # the runner's own names for the planted tests
        canaries = {k: spec["ids"][k].replace("{name}", canaries[k].split("::", 1)[1]) for k in ("pass", "fail")}
    guarded = digests(guard)
    os.write(go_w, b"1")
    os.close(go_w)
    probed = (lambda tree, src, path: probe_comparisons(tree)) if cfg["runner"] == "sympy" else None
    fresh = FreshCompiles(cfg["repo"].rstrip("/") + "/", cfg.get("guard", []), [None] + ([probed] if probed else []))
    status, strays, bufs, still_open = collect(pid, (rec_r, log_r))
    after = digests(guard)
    root = cfg["repo"].rstrip("/") + "/"
    tests_changed = sorted(p[len(root) :] for p in guard if after[p] != guarded[p])
    records, bad = verified_records(bytes(bufs[rec_r]), key)
    log = bytes(bufs[log_r])
    with open(cfg["log"], "wb") as f:
        f.write(log)
    if wanted and canaries:
        keep = wanted | set(canaries.values())
        records = [r for r in records if r.get("k") != "test" or r["id"] in keep or r.get("legacy") in keep]
    fresh.verify(records)
    summary = {
        "exit": os.waitstatus_to_exitcode(status),
        "records": records,
        "bad_records": bad,
        "log_sha256": hashlib.sha256(log).hexdigest(),
        "open_after_exit": still_open,
        "stray_processes": strays,
        "canaries": canaries,
        "tests_changed": tests_changed,
    }
    sys.stderr.write(log[-4000:].decode("utf-8", "replace"))
    sys.stderr.flush()
    write_summary(nonce, summary, summary_path)
    code = summary["exit"]
    os._exit(code if 0 <= code < 256 else 128 + (-code % 128))


if __name__ == "__main__":
    main()
