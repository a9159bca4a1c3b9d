"""The grading test run as it executes inside the sandbox (the image's Python; never imports legorl).

Why a supervisor: the code under test runs in the same interpreter as pytest's reporting,
so anything that process writes (its JUnit report, its exit status) can be rewritten by the
package. The verdict therefore rests on channels the package cannot rewrite *selectively*:

1. This process (the supervisor) reads its configuration, deletes it, plants the grader's
   canary tests among the task's own tests, then forks. It never imports the repository.
2. The child imports pytest (before the repository is on `sys.path`), takes a *snapshot* of
   pytest's, pluggy's and unittest's functions and classes, and runs pytest with the
   recorder plugin (`lg_recorder.py`) registered first. The recorder notes what each test really raised,
   at the innermost level (`pytest_pyfunc_call`) and per phase, and streams the records
   over a pipe, each with an HMAC, as they happen. At session end it diffs the snapshot
   (report classes, hook implementations, the JUnit writer: patched ⇒ listed) and sends it.
3. The JUnit report goes to a pipe (`--junitxml=/proc/self/fd/N`), not a file: whatever
   writes into it after pytest did (an `atexit`/`os._exit` trick, a left-behind daemon)
   can only append, which breaks the XML. The supervisor writes it to the report path and
   prints one summary line, tagged with a nonce the child never sees, to its own stdout
   (the child's output goes to a log file).

Usage: `python -I -B pytest_main.py CONFIG.json`; the grader compares the summary, the
recorder's records and the report (`legorl/verify/verdict.py`).

This file is the run's two processes from end to end; what they use is in the modules beside it,
copied in with it (stdlib only, named `lg_*` so that no module of the task's shadows them):
`lg_canaries` (planted among the task's tests), `lg_snapshot` (pytest's machinery before and
after), `lg_watch` (whose code did what), `lg_probes` (equality probes), `lg_compiles` (the fresh
compiles a test's code is checked against), `lg_recorder` (the plugin and its sender) and
`lg_supervise` (the supervising process). `native_main.py` shares all but the recorder.
"""

import hashlib
import json
import os
import sys
import time

# The supervisor's modules lie beside this file; `python -I` leaves its folder off the path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lg_compiles import FreshCompiles, pytest_likely, pytest_transforms
from lg_probes import probe_assert_equal, probe_rewrites
from lg_recorder import kinds, make_recorder, sender, test_observers
from lg_snapshot import changed_since, digests, snapshot
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


def child(cfg, key, rec_w, junit_w, log_fd, go_r):
    """Run pytest with the recorder once the supervisor says go; never returns.

    Importing pytest and taking the snapshot overlap with the supervisor planting the
    canaries and hashing the test files (two cores are two cores). Every step up to the
    go is done before any repository code can run: the repository is not on `sys.path`."""
    _exit = os._exit  # bound before the repository can replace it
    started_ns = time.time_ns()
    child_stdio(log_fd)
    import_pytest()  # imported while the repository is not yet on sys.path
    import unittest.case

    import _pytest.outcomes
    import _pytest.python
    import pytest

    repo = cfg["repo"].rstrip("/") + "/"
    transforms = pytest_transforms()  # how pytest may have compiled a module, before the probe joins its rewrite
    watch = Watch(repo, cfg.get("agent_files", []), cfg.get("test_files", []), started_ns, sys._getframe, transforms)
    probe_rewrites(watch)
    kind_of = kinds(_pytest.outcomes.Skipped, _pytest.outcomes.XFailed, unittest.case.SkipTest)
    extras = {}  # nodeid -> what the recorder saw besides outcomes (provenance, skip origin, markers)
    current = [None]  # the item whose call phase is running
    box = [None]  # the recorder, once made (the test-call observers write its phases)
    innermost, call_test_method = test_observers(watch, extras, current, box, kind_of)
    unittest.case.TestCase._callTestMethod = call_test_method
    probe_assert_equal(unittest.case.TestCase, watch)
    watch.wrap_threads()
    watch.writers.wrap_pytest()  # the monkeypatch fixture's writes are the test's own (`lg_writes`)
    snap = snapshot(sys.modules)
    watch.install()  # after the snapshot, before any repository code
    send = sender(key, rec_w)
    ctx = {
        "pytest": pytest,
        "repo": repo,
        "watch": watch,
        "extras": extras,
        "current": current,
        "innermost": innermost,
        "kind_of": kind_of,
        "send": send,
        "gettrace": sys.gettrace,
        "function_cls": _pytest.python.Function,
    }
    machinery_changed = lambda: changed_since(snap, sys.modules, repo, started_ns, watch.origins)  # noqa: E731
    recorder, own_changes = make_recorder(ctx, machinery_changed)
    box[0] = recorder
    if os.read(go_r, 1) != b"1":  # the supervisor could not prepare the run
        _exit(SETUP_FAILED)
    os.close(go_r)
    sys.path.append(repo[:-1])
    args = list(cfg["args"]) + ["--junitxml=/proc/self/fd/%d" % junit_w]
    cfg.clear()
    try:
        code = int(pytest.main(args, plugins=[recorder]))
    except BaseException:  # raised by the code under test; the records decide what happened
        import traceback

        traceback.print_exc()
        code = 3
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        _exit(code)


def import_pytest():
    """pytest, its default plugins and what the recorder watches, imported (and so in the
    snapshot) before the repository is importable."""
    import importlib

    import _pytest.assertion.rewrite  # noqa: F401
    import _pytest.config
    import _pytest.outcomes  # noqa: F401
    import _pytest.python  # noqa: F401
    import pytest  # noqa: F401

    for plugin in _pytest.config.default_plugins:
        try:
            importlib.import_module("_pytest." + plugin)
        except ImportError:
            pass
    import builtins  # noqa: F401
    import threading  # noqa: F401
    import unittest.case  # noqa: F401


def main():
    cfg_path = sys.argv[1]
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    os.unlink(cfg_path)
    nonce, key = cfg.pop("nonce"), bytes.fromhex(cfg.pop("key"))
    summary_path = cfg.pop("summary", None)  # like the nonce, never the child's to know
    spec = cfg.pop("plant")
    wanted = set(cfg.pop("wanted", None) or ())  # the task's tests: only theirs go in the summary
    rec_r, rec_w = os.pipe()
    junit_r, junit_w = os.pipe()
    go_r, go_w = os.pipe()
    log_fd = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    # pytest is imported once, here, before the fork (the repository is not on sys.path: `-I`,
    # and its directory is added by the child only): the child inherits it, and this process
    # needs its assertion rewriter for the fresh compiles it checks the test code against
    sys.dont_write_bytecode = True
    import _pytest.assertion.rewrite  # noqa: F401
    import pytest  # noqa: F401

    pid = os.fork()
    if pid == 0:
        try:
            nonce = wanted = summary_path = None  # noqa: F841  (the child must learn neither the tag nor the task's tests)
            for fd in (rec_r, junit_r, go_w):
                os.close(fd)
            child(cfg, key, rec_w, junit_w, log_fd, go_r)
        finally:
            os._exit(3)
    for fd in (rec_w, junit_w, log_fd, go_r):
        os.close(fd)
    # While the child imports pytest: become the reaper of whatever the run leaves behind,
    # non-dumpable (the child cannot open this process's fds or memory: the summary's
    # tag), plant the canaries, hash the test files; then let the child run the tests.
    subreaper()
    undumpable()
    guard = [cfg["repo"].rstrip("/") + "/" + p for p in cfg.get("guard", [])]
    canaries = plant_or_stop(pid, spec, nonce)
    guarded = digests(guard)
    os.write(go_w, b"1")
    os.close(go_w)
    root = cfg["repo"].rstrip("/") + "/"
    transforms = pytest_transforms()
    fresh = FreshCompiles(root, cfg.get("guard", []), transforms, pytest_likely(transforms))
    status, strays, bufs, still_open = collect(pid, (rec_r, junit_r))
    after = digests(guard)
    tests_changed = sorted(p[len(root) :] for p in guard if after[p] != guarded[p])
    records, bad = verified_records(bytes(bufs[rec_r]), key)
    if any(r.get("k") == "end" and r.get("pass_hook") for r in records):  # the repository's ini asks for it
        transforms = pytest_transforms(pass_hook=True)
        fresh = FreshCompiles(root, cfg.get("guard", []), transforms, pytest_likely(transforms))
    records, neighbours = kept_records(records, wanted, canaries)
    fresh.verify(records)
    junit = bytes(bufs[junit_r])
    if junit:
        with open(cfg["junit"], "wb") as f:
            f.write(junit)
    summary = {
        "exit": os.waitstatus_to_exitcode(status),
        "records": records,
        "bad_records": bad,
        "junit_sha256": hashlib.sha256(junit).hexdigest() if junit else None,
        "open_after_exit": still_open,
        "stray_processes": strays,
        "canaries": canaries,
        "neighbours": neighbours,
        "tests_changed": tests_changed,
    }
    report(cfg["log"], nonce, summary, summary_path)


def kept_records(records, wanted, canaries):
    """(records, neighbours): with the task's tests known, only their records and the canaries'
    are kept (a run may have thousands of tests), and how the canaries' neighbours fared."""
    if not (wanted and canaries):
        return records, None
    host = canaries["pass"].split("::", 1)[0] + "::"
    keep = wanted | {canaries["pass"], canaries["fail"], *canaries.get("more_fail", [])}
    near = [r for r in records if r.get("k") == "test" and r["id"].startswith(host) and r["id"] not in keep]
    neighbours = {"ran": len(near), "set_up": sum((r.get("phases") or {}).get("setup") == "passed" for r in near)}
    return [r for r in records if r.get("k") != "test" or r["id"] in keep], neighbours


def report(log_path, nonce, summary, summary_path):
    """The tail of the child's output on stderr (evidence only), the one tagged summary line
    on stdout (`write_summary`), and the child's exit status as ours; never returns."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4000))
            sys.stderr.write(f.read().decode("utf-8", "replace"))
        sys.stderr.flush()
    except OSError:
        pass
    write_summary(nonce, summary, summary_path)
    code = summary["exit"]
    os._exit(code if 0 <= code < 256 else 128 + (-code % 128))


if __name__ == "__main__":
    main()
