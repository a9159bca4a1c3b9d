"""The native runners' recorder: each test of Django's runner (unittest) or SymPy's `bin/test`
observed at its innermost call, what it raised noted as it propagates, and its record sent
HMAC-tagged down the record pipe.

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""

import builtins
import functools
import sys

from lg_origin import origin_of
from lg_probes import probe_assert_equal, probe_comparisons
from lg_supervise import tagged_sender


def kind_of(exc, skip_names=("SkipTest", "Skipped", "Skip")):
    if exc is None:
        return "passed"
    name = type(exc).__name__
    if name in skip_names:
        return "skipped"
    if name in ("XFail", "_ExpectedFailure"):
        return "xfailed"
    return "failed"


def sender(key, rec_w):
    """`send(kind, **fields)`: the native recorder's records, JSON-encoded (lg_supervise's framing)."""
    return tagged_sender(key, rec_w)


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
    probe_assert_equal(TC, watch)
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
        mod = sys.modules.get(cls.__module__)
        if getattr(mod, "__file__", None) in watch.tests:
            watch.test_globals(mod, mod.__file__)
        try:
            return orig_run(self, result)
        finally:
            if getattr(mod, "__file__", None) in watch.tests:  # and as it ends (a name swapped back later is
                watch.test_globals(mod, mod.__file__, during=True)  # still seen by the comparing asserts)
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
    test file the runner execs is replaced by a recording wrapper, its comparisons probed.
    The dict the file was exec'd into is its namespace: its names are remembered when the
    exec returns and checked before and after each test (`lg_names`), as a module's are."""
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
                    watch.names.ours[id(globals[name])] = globals[name]
            watch.names.remember(globals, file)  # the file's names as its own code bound them
        return r

    builtins.exec = exec_
    builtins.__lg_probe__ = watch.probe
    return {"exec": exec_}, builtins


def sympy_recorder(func, file, key, watch, send, repo):
    """A recording wrapper of the test function `func` (`functools.wraps`: the runner's
    sorting by source line and its `_slow` marks see the original)."""
    own = watch.provenance(key, func)
    code = watch.pending if own == "own" else None

    names, path = func.__globals__, repo + file  # the dict the runner exec'd the file into

    @functools.wraps(func)
    def test(*a, **kw):
        x = {"own": own} if own != "own" else {"code": code}
        watch.test_globals(names, path)
        try:
            r = func(*a, **kw)
        except BaseException as exc:
            watch.test_globals(names, path, during=True)
            kind = kind_of(exc)
            if kind != "failed":
                x["origin"] = origin_of(exc, watch, repo + file)
            send("test", id=func.__name__, file=file, phases={"setup": "passed", "call": kind}, x=x)
            raise
        watch.test_globals(names, path, during=True)
        send("test", id=func.__name__, file=file, phases={"setup": "passed", "call": "passed"}, x=x)
        return r

    return test


def probed(source, test_files):
    """A test file's code as the runner compiled it, every == / != operand probed
    (`probe_comparisons`); the provenance check compiles it the same way."""
    fn = getattr(source, "co_filename", None)
    if fn not in test_files or source.co_name != "<module>":
        return source
    try:
        import ast

        with open(fn, "rb") as f:
            src = f.read()
        if compile(src, fn, "exec", dont_inherit=True) != source:
            return source  # not the file as it is on disk (other flags, or code claiming its name)
        return compile(probe_comparisons(ast.parse(src, fn)), fn, "exec", dont_inherit=True)
    except Exception:
        return source
