"""A grading run of a repository's own test runner (Django's `tests/runtests.py`, SymPy's
`bin/test`) as it executes inside the sandbox (the image's Python; never imports legorl).

The same design as the pytest supervisor (`in_sandbox/supervisor.py`, whose helpers this loads from
the file next to it): the supervisor reads and deletes its configuration, plants the
canaries among the task's own tests, hashes the task's test files, then forks. The child
installs a *recorder* at the innermost call of each test before the repository is
importable, then runs the runner's script (`runpy`) with its output on a pipe to the
supervisor, so nothing written after it can replace the log (only append to it).

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

Usage: `python -I -B run.py CONFIG.json`.
"""

import builtins
import functools
import hashlib
import hmac
import importlib.util
import json
import os
import sys
import time

SETUP_FAILED = 86


def _load_base():
    spec = importlib.util.spec_from_file_location(
        "_lg_supervisor", os.path.join(os.path.dirname(os.path.abspath(__file__)), "base.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


base = _load_base()
base.WATCH_ATTRS = dict(base.WATCH_ATTRS, builtins=("open", "__import__", "exec", "compile", "__lg_probe__"))
base.WATCH_MODULES = base.WATCH_MODULES + (
    "unittest.runner",
    "unittest.suite",
    "unittest.loader",
)  # the result classes that print the log


def kind_of(exc, skip_names=("SkipTest", "Skipped", "Skip")):
    if exc is None:
        return "passed"
    name = type(exc).__name__
    if name in skip_names:
        return "skipped"
    if name in ("XFail", "_ExpectedFailure"):
        return "xfailed"
    return "failed"


def child(cfg, key, rec_w, log_w, go_r):
    """Run the runner's script with the recorder once the supervisor says go; never returns.
    Everything up to the go happens before the repository is on `sys.path`."""
    _exit = os._exit
    started_ns = time.time_ns()
    _child_stdio(log_w)
    import_watched()
    send = sender(key, rec_w)
    repo = cfg["repo"].rstrip("/") + "/"
    watch = base.Watch(repo, cfg.get("agent_files", []), cfg.get("test_files", []), started_ns, sys._getframe)
    if cfg["runner"] == "unittest":
        wrappers, owner = record_unittest(watch, send)
    else:  # sympy
        wrappers, owner = record_sympy(watch, send, repo, {repo + p for p in cfg["test_files"]})
    snap = base.snapshot(sys.modules)
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
            changed=base.changed_since(snap, sys.modules, repo, started_ns) + own_changes(),
            hooks=watch.hooks_now(threading),
            events=list(watch.events),
            exitstatus=code,
        )
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        _exit(code if 0 <= code < 256 else 1)


def _child_stdio(log_w):
    """The child's stdout and stderr go to the log pipe, its stdin is /dev/null."""
    os.dup2(log_w, 1)
    os.dup2(log_w, 2)
    os.close(log_w)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.dont_write_bytecode = True


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


def sender(key, rec_w):
    """`send(kind, **fields)`: one HMAC-tagged record down the record pipe, in batches."""
    write, dumps, mac_of = os.write, json.dumps, hmac.digest
    seq = [0]
    pending = []

    def send(kind, **fields):
        seq[0] += 1
        body = dumps(dict(fields, k=kind, n=seq[0]))
        pending.append(mac_of(key, body.encode(), "sha256").hex() + " " + body + "\n")
        if len(pending) >= 64 or kind == "end":
            data = "".join(pending).encode()
            del pending[:]
            while data:
                data = data[write(rec_w, data) :]

    return send


def record_unittest(watch, send):
    """(wrappers, their owner): `TestCase`'s set-up, method, tear-down and `run` wrapped to
    record each test, and `_Outcome.testPartExecutor` to see what each part raised."""
    import unittest.case

    TC = unittest.case.TestCase
    Outcome = unittest.case._Outcome
    phases = {}
    extras = {}
    orig = {n: vars(TC)[n] for n in ("_callSetUp", "_callTestMethod", "_callTearDown", "run")}
    wrappers = {}
    for name, when in (("_callSetUp", "setup"), ("_callTestMethod", "call"), ("_callTearDown", "teardown")):
        wrappers[name] = phase_wrapper(orig[name], when, watch, phases, extras)
    wrappers["run"] = run_wrapper(orig["run"], watch, phases, extras, send)
    for name, fn in wrappers.items():
        setattr(TC, name, fn)
    Outcome.testPartExecutor = part_executor_wrapper(Outcome.testPartExecutor, phases)
    base.probe_assert_equal(TC, watch)
    return wrappers, TC


def part_executor_wrapper(part_executor, phases):
    """Every part of a test (set-up, the method, each subTest, tear-down) runs in here: what
    it raised is noted as it propagates, before any result class hears of it, so a result
    that rewrites the outcome afterwards changes nothing we read."""
    import contextlib

    @contextlib.contextmanager
    def testPartExecutor(self, test_case, subTest=False):
        with part_executor(self, test_case, subTest):
            try:
                yield
            except BaseException as exc:
                case = getattr(test_case, "test_case", test_case) if subTest else test_case
                if subTest and kind_of(exc) == "failed":
                    phases.setdefault(id(case), {})["subtest"] = "failed"
                raise

    return testPartExecutor


def phase_wrapper(fn, when, watch, phases, extras):
    """`fn` (a TestCase phase method), noting what it raised; for the call, whose code it runs."""

    def wrapped(self, *a, **kw):
        if when == "call" and a:
            x = extras.setdefault(id(self), {})
            x["own"] = watch.provenance(
                getattr(self, "_testMethodName", ""), a[0], sys.modules.get(type(self).__module__)
            )
            if x["own"] == "own":
                x["code"] = watch.pending
        try:
            r = fn(self, *a, **kw)
        except BaseException as exc:
            phases.setdefault(id(self), {})[when] = kind_of(exc)
            raise
        ph = phases.setdefault(id(self), {})
        ph[when] = "failed" if when == "call" and ph.get("subtest") == "failed" else "passed"
        return r

    return wrapped


def run_wrapper(orig_run, watch, phases, extras, send):
    """`TestCase.run`, checking the test's class first and sending its record after."""

    def run(self, result=None):
        cls = type(self)
        x = extras.setdefault(id(self), {})
        bad = watch.machinery(cls, self)
        if bad:
            x["machinery"] = bad
        if not watch.resolves(cls):
            x["own"] = "class_not_in_module"
        try:
            return orig_run(self, result)
        finally:
            ph = phases.pop(id(self), {})
            ph.pop("subtest", None)
            x = extras.pop(id(self), {})
            m = getattr(self, "_testMethodName", "?")
            send(
                "test",
                id="%s (%s.%s.%s)" % (m, cls.__module__, cls.__qualname__, m),
                legacy="%s (%s.%s)" % (m, cls.__module__, cls.__qualname__),
                phases=ph,
                x=x,
                xfail=bool(getattr(getattr(self, m, None), "__unittest_expecting_failure__", False)),
            )

    return run


def record_sympy(watch, send, repo, test_files):
    """(wrappers, their owner): the builtin `exec` wrapped, so each test function of a task
    test file the runner execs is replaced by a recording wrapper, its comparisons probed."""
    real_exec = builtins.exec

    def exec_(source, globals=None, locals=None, *a, **kw):
        source = probed(source, test_files)
        r = real_exec(source, globals, locals, *a, **kw) if locals is not None else real_exec(source, globals, *a, **kw)
        file = globals.get("__file__") if isinstance(globals, dict) else None
        if file in test_files:
            import inspect

            for name, val in list(globals.items()):
                if (
                    name.startswith("test_")
                    and inspect.isfunction(val)
                    and not inspect.isgeneratorfunction(val)
                    and getattr(val, "__code__", None) is not None
                    and val.__code__.co_filename == file
                ):
                    globals[name] = sympy_recorder(val, file[len(repo) :], name, watch, send, repo)
        return r

    builtins.exec = exec_
    builtins.__lg_probe__ = watch.probe
    return {"exec": exec_}, builtins


def sympy_recorder(func, file, key, watch, send, repo):
    """A recording wrapper of the test function `func` (`functools.wraps`: the runner's
    sorting by source line and its `_slow` marks see the original)."""
    own = watch.provenance(key, func)
    code = watch.pending if own == "own" else None

    @functools.wraps(func)
    def test(*a, **kw):
        x = {"own": own} if own != "own" else {"code": code}
        try:
            r = func(*a, **kw)
        except BaseException as exc:
            kind = kind_of(exc)
            if kind != "failed":
                x["origin"] = base.origin_of(exc, watch, repo + file)
            send("test", id=func.__name__, file=file, phases={"setup": "passed", "call": kind}, x=x)
            raise
        send("test", id=func.__name__, file=file, phases={"setup": "passed", "call": "passed"}, x=x)
        return r

    return test


def probed(source, test_files):
    """A test file's code as the runner compiled it, every == / != operand probed
    (`base.probe_comparisons`); the provenance check compiles it the same way."""
    fn = getattr(source, "co_filename", None)
    if fn not in test_files or source.co_name != "<module>":
        return source
    try:
        import ast

        with open(fn, "rb") as f:
            src = f.read()
        if compile(src, fn, "exec", dont_inherit=True) != source:
            return source  # not the file as it is on disk (other flags, or code claiming its name)
        return compile(base.probe_comparisons(ast.parse(src, fn)), fn, "exec", dont_inherit=True)
    except Exception:
        return source


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
    spec = cfg.pop("plant")
    wanted = set(cfg.pop("wanted", None) or ())
    rec_r, rec_w = os.pipe()
    log_r, log_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            nonce = wanted = None  # noqa: F841
            for fd in (rec_r, log_r, go_w):
                os.close(fd)
            child(cfg, key, rec_w, log_w, go_r)
        finally:
            os._exit(3)
    for fd in (rec_w, log_w, go_r):
        os.close(fd)
    base._subreaper()
    base._undumpable()
    guard = [cfg["repo"].rstrip("/") + "/" + p for p in cfg.get("guard", [])]
    try:
        canaries = base.plant(spec) if spec else None
    except (LookupError, OSError, UnicodeDecodeError) as exc:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        sys.stderr.write("legorl-supervisor: %s\n" % exc)
        os._exit(SETUP_FAILED)
    if canaries and spec.get("ids"):  # the runner's own names for the planted tests
        canaries = {k: spec["ids"][k].replace("{name}", canaries[k].split("::", 1)[1]) for k in ("pass", "fail")}
    guarded = base.digests(guard)
    os.write(go_w, b"1")
    os.close(go_w)
    probed = (lambda tree, src, path: base.probe_comparisons(tree)) if cfg["runner"] == "sympy" else None
    fresh = base.FreshCompiles(
        cfg["repo"].rstrip("/") + "/", cfg.get("guard", []), [None] + ([probed] if probed else [])
    )
    status, strays, bufs, still_open = base.collect(pid, (rec_r, log_r))
    after = base.digests(guard)
    root = cfg["repo"].rstrip("/") + "/"
    tests_changed = sorted(p[len(root) :] for p in guard if after[p] != guarded[p])
    records, bad = base.verified_records(bytes(bufs[rec_r]), key)
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
    sys.stdout.write("\n%s %s\n" % (nonce, json.dumps(summary, sort_keys=True)))
    sys.stdout.flush()
    code = summary["exit"]
    os._exit(code if 0 <= code < 256 else 128 + (-code % 128))


if __name__ == "__main__":
    main()
