"""Who wrote a test module's names: any write seen (the dict's version tag), and the writers
whose writes are the test's own.

A test module imports the package, so package code can write the module's names while a test
runs: a stand-in bound before the test loads a name and put back before its comparison (or
after it) leaves every value as it was at each check. Two things close that:
- `tag_reader(d)`: CPython keeps in every dict a version tag that each change of the dict
  moves (PEP 509's `ma_version_tag`, 3.6 to 3.13), read here through ctypes. A namespace whose
  tag moved since its last check was written, even when every value is back (`lg_names`).
- `Writers`: the test's own patches go through pytest's `MonkeyPatch` and `unittest.mock`'s
  patchers. Their methods are wrapped: what a call writes into a watched namespace is the
  test's when the call is (`decide`: test code, or the test machinery for a patcher's
  decorator), and is recorded as such; any other write (package code through the module's
  `__dict__`, `vars()`, `setattr`, a helper thread, or these same writers called by it) is
  not, whatever the value it binds.

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""

import sys

MONKEYPATCH_WRITES = ("setattr", "setitem", "delattr", "delitem")


def tag_kind():
    """The ctypes type of a dict's version tag where it can be read (checked on a dict of our
    own: a change moves it, a read does not), else None."""
    if sys.implementation.name != "cpython" or not (3, 6) <= sys.version_info[:2] <= (3, 13):
        return None
    try:
        import ctypes

        if ctypes.sizeof(ctypes.c_void_p) != 8:
            return None
        d = {"a": 1}
        view = ctypes.c_uint64.from_address(id(d) + 3 * ctypes.sizeof(ctypes.c_ssize_t))
        t0 = view.value
        d["a"] = 2
        t1 = view.value
        d["b"] = 3
        t2 = view.value
        return ctypes.c_uint64 if t0 != t1 and t1 != t2 and view.value == t2 else None
    except Exception:
        return None


def tag_reader(kind, d):
    """A view of dict `d`'s version tag (`.value`), or None. The view reads `d`'s memory: the
    caller keeps `d` alive as long as it keeps the view."""
    if kind is None or type(d) is not dict:
        return None
    import ctypes

    return kind.from_address(id(d) + 3 * ctypes.sizeof(ctypes.c_ssize_t))


class Writers:
    """Wraps the honest writers (`wrap_pytest` before the snapshot, `wrap_mock` once the test
    modules are loaded); each wrapped call is judged first (`Names.settle`: what was written
    before it is not its doing), then its writes recorded (`Names.written`)."""

    def __init__(self, watch):
        self.watch, self.names = watch, watch.names
        self.done = set()
        self.depth = 0  # a patcher that enters others (patch.multiple): the outer call answers for all

    def wrap_pytest(self):
        mod = sys.modules.get("_pytest.monkeypatch")
        cls = getattr(mod, "MonkeyPatch", None)
        for name in MONKEYPATCH_WRITES:
            self.wrap(cls, name, "write")
        self.wrap(cls, "undo", "restore")

    def wrap_mock(self):
        """`unittest.mock`'s patchers (and the `mock` backport's), once imported: a patch is
        entered by the test's code, or by the patcher's own decorator."""
        for modname in ("unittest.mock", "mock.mock"):
            mod = sys.modules.get(modname)
            if mod is None or modname in self.done:
                continue
            self.done.add(modname)
            patch, patch_dict = vars(mod).get("_patch"), vars(mod).get("_patch_dict")
            self.wrap(patch, "__enter__", "enter")
            self.wrap(patch, "__exit__", "restore")
            self.wrap(patch_dict, "_patch_dict", "enter")
            self.wrap(patch_dict, "_unpatch_dict", "restore")

    def wrap(self, cls, name, kind):
        real = vars(cls).get(name) if isinstance(cls, type) else None
        code = getattr(real, "__code__", None)
        if code is None or code.co_name != name or self.watch.origins.agents(code):
            return  # not the library's own method (replaced before we came): its writes stay unexplained
        writers = self

        def honest_writer(*a, **k):
            return writers.around(real, kind, name, a, k)

        honest_writer.__name__, honest_writer.__qualname__ = name, real.__qualname__
        honest_writer.__doc__, honest_writer.__wrapped__ = real.__doc__, real
        self.watch.quietly(setattr, cls, name, honest_writer)

    def around(self, real, kind, method, a, k):
        names = self.names
        if self.depth or not names.first:  # nested, or nothing watched yet (collection)
            return real(*a, **k)
        self.depth += 1
        try:
            for path, name in names.settle():
                self.watch.note("test_globals:%s:%s" % (self.watch.rel(path), name))
            honest = False
            if kind != "restore":  # a restore is judged by what it puts back
                who, frame = self.decide(self.watch.getframe(2))  # the wrapper's caller
                if kind == "write":  # the test's code calls the fixture's method itself
                    honest = who in ("test", "package") and method in frame.f_code.co_names
                else:
                    honest = who != "agent"
            try:
                return real(*a, **k)
            finally:
                names.written(honest)
        finally:
            self.depth -= 1

    def decide(self, frame):
        """(who, frame): whose code made the call, as `Watch.who` walks the stack: the first
        frame of the repository (or of generated code, or of code that is not what it claims)
        decides: "test" (a test file or conftest), "agent", "package" (the repository's other
        code); "machinery" when none is on the stack (pytest's own teardown) but in a thread
        the agent's code started, which is the agent's."""
        w, origins = self.watch, self.watch.origins
        f, depth = frame, 0
        while f is not None and depth < 200:
            code = f.f_code
            fn = code.co_filename
            if fn.startswith("<") and not fn.startswith("<frozen"):
                owner = origins.generated_owner(f.f_globals)
                if owner is None or origins.file_is_agents(owner):
                    return "agent", f
                if owner.startswith(w.repo):
                    return ("test" if origins.file_kind(owner) == "tests" else "package"), f
            elif fn.startswith(w.repo) and origins.file_kind(fn) == "tests":
                return "test", f
            elif origins.agents(code):
                return "agent", f
            elif fn.startswith(w.repo):
                return "package", f
            f, depth = f.f_back, depth + 1
        return ("agent" if w.threads.get(w.get_ident()) else "machinery"), None
