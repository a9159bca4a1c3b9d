"""Whose code did what, for the recorder: `Watch` (the audit hook, a test's code traced to the
file it claims, the test's classes and module checked, the equality probe, interpreter-wide
hooks).

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""

import os

from lg_compiles import code_digest
from lg_names import Names
from lg_origin import MACHINERY, Origins
from lg_snapshot import func_of
from lg_values import Values
from lg_writes import Writers, tag_kind, tag_reader

# Interpreter events through which code can change how tests run or are judged without
# replacing anything the snapshot holds: hooks that run on every call, code objects
# swapped or functions cloned around a test's code, the heap searched for the grader's
# objects, raw memory. Each is the agent's when the code that caused it is (`Watch.who`).
AUDITED = frozenset(
    {
        "sys.setprofile",
        "sys.settrace",
        "sys.addaudithook",
        "sys._current_frames",
        "function.__new__",
        "code.__new__",
        "object.__setattr__",
        "object.__delattr__",
        "compile",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
    }
)
SWAPPED_ATTRS = frozenset({"__code__", "__class__", "__defaults__", "__kwdefaults__", "__globals__", "__closure__"})


class Watch:
    """Whose code did what, for the recorder: the repository files the agent changed or added
    (and any written during the run, and code that claims no real file) are the agent's.

    `install()` adds the audit hook (before any repository code runs; an audit hook can be
    neither listed nor removed from Python), whose findings (`events`) go out with the
    session's end record. `provenance(name, func)` says whether the function a test item
    runs can be the test file's own code, and leaves in `pending` the digests of that code
    for the supervisor to find in its fresh compile of the file (`FreshCompiles`)."""

    def __init__(self, repo, agent_files, test_files, started_ns, getframe, transforms=None):
        import _thread

        self.repo = repo
        self.agent = {repo + p for p in agent_files}
        self.tests = {repo + p for p in test_files}
        self.started_ns = started_ns
        self.getframe = getframe
        self.events = []
        self.busy = False
        self.pending = []  # (file, digest) of the code the last `provenance` vouched for, to be checked
        self.digest = code_digest  # bound before any repository code runs
        self.origins = Origins(repo, self.agent, self.tests, started_ns, transforms)
        self.values = Values(self.origins, self.test_words)
        kind = tag_kind()  # ctypes imported and checked before any repository code runs
        self.names = Names(repo, lambda g: self.quietly(tag_reader, kind, g))
        self.writers = Writers(self)  # the test's own patches (`wrap_pytest` is the recorder's to call)
        self.names.prepare = self.writers.wrap_mock
        self.words = None
        self.threads = {}  # thread id -> the agent's file that started it (while it runs)
        self.get_ident = _thread.get_ident

    def quietly(self, fn, *args):
        """`fn(*args)` with the audit hook deaf: the supervisor's own ctypes view and patches."""
        was, self.busy = self.busy, True
        try:
            return fn(*args)
        finally:
            self.busy = was

    def is_agents(self, fn):
        """Is code from file `fn` the agent's, by its name alone (changed, added or written
        during the run, or made up)? Where there is a code object, `origins.agents` decides."""
        return self.origins.file_is_agents(fn)

    def rel(self, fn):
        return fn[len(self.repo) :] if fn.startswith(self.repo) else fn

    def who(self, frame):
        """The agent's file responsible for what `frame` is doing, or None: the innermost
        frame of the repository, of generated code or of code that claims a file it was not
        compiled from decides; the standard library, installed packages and pytest in between
        are only the means. A thread the agent's code started is the agent's throughout."""
        f, depth = frame, 0
        while f is not None and depth < 200:
            code = f.f_code
            fn = code.co_filename
            if fn.startswith("<") and not fn.startswith("<frozen"):
                owner = self.origins.generated_owner(f.f_globals)
                if owner is None or self.is_agents(owner):
                    return self.rel(owner) if owner else fn
                if owner.startswith(self.repo):
                    return None
            elif fn.startswith(self.repo) and self.origins.file_kind(fn) == "tests":
                return None
            elif self.origins.agents(code):
                return self.rel(fn)
            elif fn.startswith(self.repo):
                return None
            f, depth = f.f_back, depth + 1
        return self.threads.get(self.get_ident())

    def install(self):
        import sys as _sys

        _sys.addaudithook(self.audit)

    def wrap_threads(self):
        """Threads started by the agent's code carry that attribution (`who`): the functions
        that start threads are wrapped, before the snapshot (which then watches them)."""
        import _thread
        import threading

        watch, getframe = self, self.getframe
        starters = (
            (_thread, ("start_new_thread", "start_joinable_thread")),
            (threading, ("_start_new_thread", "_start_joinable_thread")),
        )
        for mod, names in starters:
            for name in names:
                real = vars(mod).get(name)
                if real is None:
                    continue

                def start(function, *a, _real=real, **kw):
                    where = watch.who(getframe(1))
                    if where:
                        inner = function

                        def function(*fa, **fkw):
                            me = watch.get_ident()
                            watch.threads[me] = where
                            try:
                                return inner(*fa, **fkw)
                            finally:
                                watch.threads.pop(me, None)

                    return _real(function, *a, **kw)

                setattr(mod, name, start)

    def audit(self, event, args):
        if self.busy or event not in AUDITED and not event.startswith("ctypes."):
            return
        self.busy = True
        try:
            if not self.relevant(event, args):
                return
            where = self.who(self.getframe(1))
            if where and len(self.events) < 50:
                self.events.append("%s:%s" % (event, where))
        except Exception:
            pass
        finally:
            self.busy = False

    def relevant(self, event, args):
        if event.startswith("ctypes."):  # raw memory, or the interpreter's own C API; not a library's ctypes use
            if event == "ctypes.dlsym":
                return len(args) > 1 and str(args[-1]).startswith(("Py", "_Py"))
            return event in ("ctypes.addressof", "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at")
        if event in ("object.__setattr__", "object.__delattr__"):
            if args[1] not in SWAPPED_ATTRS:
                return False
            target = args[0]
            code = getattr(target, "__code__", None)
            if code is not None:  # a function: the agent's own are its business
                return not self.origins.agents(code)
            mod = getattr(type(target), "__module__", "") or ""
            return (
                getattr(target, "__file__", None) in self.tests
                or mod.split(".")[0] in MACHINERY
                or (isinstance(target, type) or mod in self.test_modules())
            )
        if event == "compile":  # code compiled under a test file's name
            return len(args) > 1 and args[1] in self.tests
        if event == "function.__new__":  # a test's code given other globals
            return getattr(args[0] if args else None, "co_filename", None) in self.tests
        if event == "code.__new__":  # code made to claim a test file's name
            return len(args) > 1 and args[1] in self.tests
        return True

    def test_modules(self):
        import sys as _sys

        return {n for n, m in list(_sys.modules.items()) if getattr(m, "__file__", None) in self.tests}

    def provenance(self, name, func, module=None):
        """ "own" when `func` (through its decorators' `__wrapped__`) is the code compiled from
        a file of the repository the agent did not write, named `name` (or defined in a
        function of the file, as a test factory makes them), and every wrapper around it is
        code the agent did not write; else what is wrong with it."""
        f, hops, wrappers = func, 0, []
        while hops < 32:
            hops += 1
            f = getattr(f, "__func__", f)
            if type(f).__name__ == "partial" and hasattr(f, "func"):
                f = f.func
                continue
            nxt = vars(f).get("__wrapped__") if hasattr(f, "__dict__") else None
            if nxt is None:
                break
            wrappers.append(f)
            f = nxt
        code = getattr(f, "__code__", None)
        if code is None:
            return "not_a_function"
        fn = code.co_filename
        if not fn.startswith(self.repo) or self.origins.agents(code):
            return "foreign_code"
        pending = [(fn[len(self.repo) :], self.digest(code))]  # the supervisor compares with its fresh compile
        if code.co_name != name and "<locals>" not in getattr(code, "co_qualname", ""):
            return "other_test_code"
        if (
            module is not None
            and fn == getattr(module, "__file__", None)
            and getattr(f, "__globals__", None) is not vars(module)
        ):
            return "foreign_globals"
        for w in wrappers:
            wc = getattr(func_of(w), "__code__", None) or getattr(getattr(type(w), "__call__", None), "__code__", None)  # noqa: B004 - the class attribute, as Python calls it
            if wc is None or self.origins.agents(wc):
                return "foreign_wrapper"
            # A decorator's wrapper takes whatever the test takes and closes over what it wraps
            # (mock.patch, contextlib, hypothesis, override_settings): a library function given a
            # `__wrapped__` by someone else, which never calls the test, is neither.
            if not (wc.co_flags & 0x04 and wc.co_freevars):
                if not wc.co_filename.startswith(self.repo):
                    return "foreign_wrapper"
                pending.append((wc.co_filename[len(self.repo) :], self.digest(wc)))
        self.pending = pending
        return "own"

    def resolves(self, cls):
        """Is `cls` what its module holds under its qualified name (a class whose
        `__module__`/`__qualname__` claim another's place does not)? Classes made inside
        functions (`<locals>`) are not checked."""
        import sys as _sys

        qual = getattr(cls, "__qualname__", "")
        mod = _sys.modules.get(getattr(cls, "__module__", ""))
        if "<locals>" in qual or mod is None or getattr(mod, "__file__", None) not in self.tests:
            return True
        obj = mod
        for part in qual.split("."):
            obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
        return obj is cls

    def machinery(self, cls, inst=None):
        """Test-machinery methods of a test's classes that are the agent's code put in place
        from elsewhere (`SimpleTestCase.subTest = …`, a result hook): code whose file is the
        agent's and which was not written in that class's own body in its own module."""
        import sys as _sys

        bad = []
        for klass in cls.__mro__:
            own_file = getattr(_sys.modules.get(klass.__module__), "__file__", None)
            for name, val in list(vars(klass).items()):
                f, hops = func_of(val), 0
                while hops < 8 and isinstance(getattr(f, "__dict__", None), dict) and "__wrapped__" in vars(f):
                    f, hops = vars(f)["__wrapped__"], hops + 1  # through decorators (contextmanager, wraps)
                code = getattr(func_of(f), "__code__", None)
                if code is None or not self.origins.func_agents(func_of(f)):
                    continue
                body = code.co_filename == own_file and getattr(code, "co_qualname", "").startswith(
                    klass.__qualname__ + "."
                )
                if not body:
                    bad.append("%s.%s" % (klass.__name__, name))
        for name, val in list(vars(inst).items()) if inst is not None else ():
            code = getattr(func_of(val), "__code__", None)
            if code is not None and callable(val) and self.origins.func_agents(func_of(val)):
                bad.append("instance.%s" % name)
        return bad[:10]

    def module_state(self, module, path):
        """ "ok" when `module` is the plain module object executed from the test file `path`."""
        import sys as _sys
        import types as _types

        if type(module) is not _types.ModuleType:
            return "module_class_replaced"
        if _sys.modules.get(module.__name__) is not module:
            return "module_replaced"
        file = vars(module).get("__file__") or ""
        if os.path.realpath(file) != os.path.realpath(path):
            return "module_file_mismatch"
        for hook in ("__getattr__", "__dir__"):
            h = vars(module).get(hook)
            if h is not None and os.path.realpath(getattr(getattr(h, "__code__", None), "co_filename", "")) != file:
                return "module_hook"
        return "ok"

    def probe(self, value):
        """`value`, noting an equality forgery: a value whose type lies to comparisons
        (`lg_values`: judged by its type's origin, then by questions no honest value says
        yes to). The comparison itself is left to the test. The calling test module's names
        are looked at too (`Names.at_compare`): a stand-in bound for a test's comparisons and
        put back before it ends is seen while it is bound."""
        try:
            g = self.getframe(1).f_globals
            if id(g) in self.names.first:
                for name in self.names.at_compare(g):
                    self.note("test_globals:%s:%s" % (self.rel(self.names.paths[id(g)]), name))
        except Exception:
            pass
        if type(value) in _PLAIN:
            if type(value) not in _CONTAINERS:
                return value
        try:
            where = self.values.liar(value)
            if where:
                self.note("equality_forged:%s" % self.rel(where))
        except Exception:
            pass
        return value

    def note(self, event):
        if event not in self.events and len(self.events) < 50:
            self.events.append(event)

    def test_globals(self, module, path, during=False):
        """Notes (and returns) the names of a test module that code other than the test's bound (`lg_names`)."""
        try:
            bad = self.names.tampered(module, path, during)
        except Exception:
            bad = []
        for name in bad:
            self.note("test_globals:%s:%s" % (self.rel(path), name))
        return bad

    def test_words(self):
        """The names the task's test files use (an honest wildcard, `mock.ANY`, is one they name)."""
        if self.words is None:
            import ast

            words = set()
            for p in self.tests:
                try:
                    with open(p, "rb") as f:
                        tree = ast.parse(f.read(), p)
                except Exception:
                    continue
                for n in ast.walk(tree):
                    words.add(getattr(n, "id", None) or getattr(n, "attr", None) or getattr(n, "name", None))
            words.discard(None)
            self.words = words
        return self.words

    def hooks_now(self, threading_mod):
        """The interpreter-wide hooks active right now that are the agent's code."""
        import sys as _sys

        out = []
        for kind, hook in (
            ("profile", _sys.getprofile()),
            ("trace", _sys.gettrace()),
            ("thread_profile", getattr(threading_mod, "_profile_hook", None)),
            ("thread_trace", getattr(threading_mod, "_trace_hook", None)),
        ):
            if hook is None:
                continue
            target = hook if hasattr(hook, "__code__") else getattr(type(hook), "__call__", None)  # noqa: B004
            code = getattr(func_of(target), "__code__", None)
            fn = code.co_filename if code is not None else "<unknown>"
            if code is not None and not fn.startswith(("<", self.repo)) and self.origins.agents(code):
                fn = "<claims %s>" % fn  # run-time code under an installed file's name
            out.append("%s:%s" % (kind, self.rel(fn)))
        return out


_PLAIN = frozenset({int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset})
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
