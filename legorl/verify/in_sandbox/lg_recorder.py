"""The pytest recorder (a plugin registered before any repository code runs) and its sender.

What each test raised, seen at the innermost call (`pytest_pyfunc_call`, unittest's
`_callTestMethod`) and per phase, goes down the record pipe HMAC-tagged as it happens; at the
session's end, what changed of pytest's machinery and of the recorder itself, and what the
package's code hooked. Its hooks come from four classes, one per part of a run.

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""

import json
import sys

from lg_origin import origin_of
from lg_snapshot import foreign_hooks, func_of, import_hooks, place_of
from lg_supervise import tagged_sender


def kinds(skipped_exc, xfailed_exc, skip_test):
    """`kind_of(exc)`: what a raised exception (None: none) means for a test phase."""

    def kind_of(exc):
        if exc is None:
            return "passed"
        if isinstance(exc, skipped_exc) or isinstance(exc, skip_test):
            return "skipped"
        if isinstance(exc, xfailed_exc):
            return "xfailed"
        return "failed"

    return kind_of


def test_observers(watch, extras, current, box, kind_of):
    """(innermost, `_callTestMethod`): the observers at the innermost call of a test, for
    functions (called by the recorder's `pytest_pyfunc_call`) and unittest methods."""
    import unittest.case

    tc_call = unittest.case.TestCase._callTestMethod

    def _callTestMethod(self, method):
        # unittest items under pytest: the innermost call of the test method, as for functions
        item = current[0]
        if item is None:
            return tc_call(self, method)
        x = extras.setdefault(item.nodeid, {})
        mod = sys.modules.get(type(self).__module__)
        watch.test_globals(mod, str(item.path))
        x["own"] = watch.provenance(getattr(self, "_testMethodName", ""), method, mod)
        if x["own"] == "own":
            x["code"] = watch.pending
        box[0].inner.add(item.nodeid)
        return innermost(item, x, tc_call, self, method)

    def innermost(item, x, call, /, *args, **kwargs):
        # The test's own call, as it returns or raises: the outcome the verdict rests on, and
        # where a skip or xfail came from (the only place both kinds of item are seen)
        try:
            r = call(*args, **kwargs)
        except BaseException as exc:
            watch.test_globals(getattr(item, "module", None), str(item.path), during=True)
            kind = kind_of(exc)
            box[0].phases.setdefault(item.nodeid, {})["inner"] = kind
            if kind != "failed":
                x["origin"] = origin_of(exc, watch, str(item.path))
            raise
        watch.test_globals(getattr(item, "module", None), str(item.path), during=True)  # as it ends, too
        box[0].phases.setdefault(item.nodeid, {})["inner"] = "passed"
        return r

    return innermost, _callTestMethod


def sender(key, rec_w):
    """`send(kind, **fields)`: the recorder's records down the record pipe (lg_supervise's
    framing); a test record is encoded by hand, ~3x faster than `json.dumps`."""
    dumps = json.dumps
    encode_str = json.encoder.encode_basestring_ascii
    flag = {True: "true", False: "false"}

    def encode(kind, n, fields):
        if kind != "test":
            return dumps(dict(fields, k=kind, n=n))
        ph = ",".join('"%s":"%s"' % kv for kv in fields["phases"].items())
        return (
            '{"k":"test","n":%d,"id":%s,"phases":{%s},"function":%s,"unit":%s,"inner":%s,"xfail":%s,"runtest":%s,"x":%s}'
            % (
                n,
                encode_str(fields["id"]),
                ph,
                flag[fields["function"]],
                flag[fields["unit"]],
                flag[fields["inner"]],
                flag[bool(fields["xfail"])],
                flag[fields["runtest"]],
                dumps(fields["x"]) if fields["x"] else "{}",
            )
        )

    return tagged_sender(key, rec_w, encode)


RECORDER_STATE = (
    "phases",
    "inner",
    "registered_from",
    "tracer",
    "tracers",
    "declared",
    "modules",
    "hooks",
    "pass_hook",
)


def make_recorder(ctx, machinery_changed):
    """(the recorder plugin, `own_changes()`): its hooks come from four classes, one per
    part of a run; `own_changes` lists any of their methods replaced or added since, and any
    attribute of the recorder that is none of its own (`RECORDER_STATE`)."""
    _Recorder = type(
        "_Recorder",
        (
            collection_hooks(ctx),
            call_hook(ctx),
            phase_hooks(ctx),
            end_hook(ctx, lambda: machinery_changed() + own_changes()),
        ),
        {"__init__": _recorder_init},
    )
    classes = _Recorder.__mro__[:-1]
    own = {(c, k): (v, getattr(func_of(v), "__code__", None)) for c in classes for k, v in vars(c).items()}
    recorder = _Recorder()

    def own_changes():
        bad = []
        for c in classes:
            now = vars(c)
            bad += [
                k
                for (cls, k), (v, code) in own.items()
                if cls is c and (now.get(k) is not v or getattr(func_of(now.get(k)), "__code__", None) is not code)
            ]
            bad += [k for k in now if (c, k) not in own]
        if type(recorder) is not _Recorder or _Recorder.__mro__[:-1] != classes:
            bad.append("__class__")
        bad += [k for k in vars(recorder) if k not in RECORDER_STATE]
        return ["recorder." + k for k in sorted(set(bad))]

    return recorder, own_changes


def _recorder_init(self):
    self.phases = {}
    self.inner = set()
    self.registered_from = {}
    self.tracer, self.tracers = None, set()
    self.declared = {}  # nodeid -> skip/xfail markers it had when collection ended
    self.modules = {}  # id(test module) -> its state
    self.hooks = set()


def collection_hooks(ctx):
    """The recorder's view of configuration and collection: the assertion pass hook, the
    skip/xfail markers each test had when collection ended, who registered each plugin."""
    pytest, repo = ctx["pytest"], ctx["repo"]

    class _Collection:
        def pytest_configure(self, config):
            self.pass_hook = bool(config.getini("enable_assertion_pass_hook"))

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_collection_modifyitems(self, session, config, items):
            yield
            for item in items:
                n = sum(1 for m in item.iter_markers() if m.name in ("skip", "skipif", "xfail"))
                if n:
                    self.declared[item.nodeid] = n
                try:
                    mod = getattr(item, "module", None)
                    if mod is not None and id(mod) not in self.modules:  # its names before any fixture ran
                        self.modules[id(mod)] = None
                        ctx["watch"].names.remember(mod, str(item.path))
                except Exception:
                    pass

        def pytest_plugin_registered(self, plugin, manager):
            # Who registers a plugin: pytest for the task's conftests and `pytest_plugins`,
            # or package code, whose frame is then on the stack (generated code included).
            files, f = set(), sys._getframe(1)
            while f is not None:
                where = place_of(f, repo, ctx["watch"].origins)
                if where:
                    files.add(where)
                f = f.f_back
            if files:
                self.registered_from[id(plugin)] = sorted(files)

    return _Collection


def call_hook(ctx):
    """The recorder's innermost observation of a test function: `pytest_pyfunc_call`."""
    import threading

    pytest, repo, watch, extras = ctx["pytest"], ctx["repo"], ctx["watch"], ctx["extras"]
    innermost, gettrace = ctx["innermost"], ctx["gettrace"]

    class _Call:
        @pytest.hookimpl(tryfirst=True)
        def pytest_pyfunc_call(self, pyfuncitem):
            # The innermost observation: the test function itself, nothing in between.
            func = pyfuncitem.obj
            names = pyfuncitem._fixtureinfo.argnames
            args = {a: pyfuncitem.funcargs[a] for a in names}
            if hasattr(func, "__code__") and func.__code__.co_flags & 0x180:  # coroutine / async generator
                self.inner.add(pyfuncitem.nodeid)  # an async plugin of the task runs it
                self.phases.setdefault(pyfuncitem.nodeid, {})["inner"] = "deferred"
                return None
            self.inner.add(pyfuncitem.nodeid)
            x = extras.setdefault(pyfuncitem.nodeid, {})
            mod = getattr(pyfuncitem, "module", None)
            state = self.modules.get(id(mod))
            if state is None:
                state = self.modules[id(mod)] = watch.module_state(mod, str(pyfuncitem.path))
            watch.test_globals(mod, str(pyfuncitem.path))
            own = watch.provenance(pyfuncitem.originalname, func, mod)
            x["own"] = own if state == "ok" else state
            if own == "own":
                x["code"] = watch.pending
            for h in watch.hooks_now(threading):
                self.hooks.add(h)
            tracer = gettrace()  # a tracer already active can skip a test's lines (its asserts)
            if tracer is not None and tracer is not self.tracer:
                self.tracer = tracer
                target = tracer if hasattr(tracer, "__code__") else getattr(type(tracer), "__call__", None)  # noqa: B004 - the class attribute, as Python calls it
                where = place_of(func_of(target), repo, watch.origins)
                self.tracers.add(
                    where or "%s.%s" % (getattr(tracer, "__module__", "?"), getattr(tracer, "__qualname__", "?"))
                )
            result = innermost(pyfuncitem, x, func, **args)
            if hasattr(result, "__await__") or hasattr(result, "__aiter__"):
                self.phases[pyfuncitem.nodeid]["inner"] = "skipped"
                pytest.skip("async def function and no async plugin installed")
            return True

    return _Call


def phase_hooks(ctx):
    """The recorder's view of each phase (set-up, call, tear-down) from its hook wrapper,
    and the test's record, sent at the end of its tear-down."""
    import threading

    pytest, watch, extras, current = ctx["pytest"], ctx["watch"], ctx["extras"], ctx["current"]
    kind_of, send, function_cls = ctx["kind_of"], ctx["send"], ctx["function_cls"]

    class _Phases:
        def _phase(self, item, when, outcome):
            exc = outcome.excinfo[1] if outcome.excinfo else None
            pending = getattr(item, "_excinfo", None)  # unittest items keep failures here
            if when == "call" and exc is None and pending:
                exc = pending[0].value
            self.phases.setdefault(item.nodeid, {})[when] = kind_of(exc)

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_setup(self, item):
            outcome = yield
            self._phase(item, "setup", outcome)

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):
            current[0] = item
            try:
                outcome = yield
            finally:
                current[0] = None
            self._phase(item, "call", outcome)

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_teardown(self, item, nextitem):
            outcome = yield
            self._phase(item, "teardown", outcome)
            ph = self.phases.pop(item.nodeid, {})
            x = extras.pop(item.nodeid, None) or {}
            if any(v != "passed" for v in ph.values()):  # a marker added while it ran (asked only then)
                now = sum(1 for m in item.iter_markers() if m.name in ("skip", "skipif", "xfail"))
                if now > self.declared.get(item.nodeid, 0):
                    x["late_marker"] = True
                if self.declared.get(item.nodeid):
                    x["declared"] = True
                for h in watch.hooks_now(threading):
                    self.hooks.add(h)
            send(
                "test",
                id=item.nodeid,
                phases=ph,
                function=type(item) is function_cls,
                unit=type(item).__name__ == "TestCaseFunction",
                x=x,
                inner=item.nodeid in self.inner,
                # as pytest's skipping plugin sees them (the task's conftests may add some;
                # markers added by the agent's own hooks are caught as agent_hooks); only
                # asked when it matters, a test that raised (the walk costs ~10 µs a test)
                xfail="failed" in ph.values() and any(True for _ in item.iter_markers("xfail")),
                runtest=("runtest" in vars(item)),
            )

    return _Phases


def end_hook(ctx, changed):
    """The session's end record: what changed of the machinery (`changed()`), the package's
    hooks, import hooks, tracers and interpreter hooks, and the audit hook's events."""
    import threading

    pytest, repo, watch, send = ctx["pytest"], ctx["repo"], ctx["watch"], ctx["send"]

    class _End:
        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_sessionfinish(self, session, exitstatus):
            yield
            send(
                "end",
                changed=changed(),
                foreign_hooks=foreign_hooks(session.config.pluginmanager, repo, self.registered_from, watch.origins),
                import_hooks=import_hooks(sys.meta_path, sys.path_hooks, repo, watch.origins),
                tracers=sorted(self.tracers),
                hooks=sorted(self.hooks | set(watch.hooks_now(threading))),
                events=list(watch.events),
                pass_hook=getattr(self, "pass_hook", False),
                exitstatus=int(exitstatus),
            )

    return _End
