"""The names a test module's code loads, and who bound them.

A test module imports the package, so package code can write into the module's namespace:
shadow the equality probe (`__lg_probe__`, looked up in the module's globals before the
builtins), rebind `pytest` or `approx` to stand-ins, or the imported function under test to a
correct one. What the module's own code binds is read from its source (`bindings`): names it
imports, defines and assigns at top level, or declares `global` in a function. At each test,
`tampered(module, path)` compares the namespace with that:
- the probe's name, or `__builtins__` that is not the interpreter's, in the module;
- a name the source never binds (a builtin shadowed, something added);
- a name bound by `import X` that is not the module `X` now; by `from X import a` that is not
  `X.a` now, for a callable, class or module (data may be updated by the module itself);
- a function or class the file defines that is no longer its own;
- any name rebound since collection ended (data included: an expected value), where the
  source does not declare that name `global` anywhere;
- pytest's `@py_builtins`/`@pytest_ar` that are not the modules its assertion rewrite binds.
Files that write their own namespace dynamically (`globals()`, `exec`, a star import) are
checked for the probe's name and their imports only.

Who wrote a name decides, not what it now holds: a name the test's own patch bound (pytest's
`monkeypatch`, `unittest.mock.patch`, called by the test's code: `lg_writes.Writers`) is the
test's; every other rebinding counts, a stand-in of the standard library's or plain data as
much as the agent's code. A write that was put back is seen too: each namespace's version tag
(`lg_writes.tag_reader`) moves with every write, so a namespace written since its last check
with every value as it was is reported as `WRITTEN` (unless the file writes its own globals).

The namespace is a module's (pytest, Django) or the bare dict SymPy's runner execs a test file
into; the recorders check it before and after each test, unittest's comparing assertions and
the probe check it as they compare (`lg_probes`, `Watch.probe`), and each honest writer before
it writes. A recorder's own wrappers of a file's test functions (`ours`) count as the file's
functions.

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""

import os
import sys

DYNAMIC = ("globals()", "vars()", "exec(", "setattr(sys.modules", "import *", "__dict__[")
MODULE_ATTRS = frozenset(
    {"__name__", "__doc__", "__package__", "__loader__", "__spec__", "__file__", "__cached__", "__builtins__"}
)
MODULE_ATTRS |= {"__annotations__", "__warningregistry__", "__path__", "__all__"}


def bindings(src, path):
    """(binds, dynamic): {name: [(kind, detail)]} of what the module's source binds at top level
    (kinds "import", "from", "def", "class", "assign", "global"), and whether it writes its
    namespace in ways the source does not show."""
    import ast

    tree = ast.parse(src, path)
    binds = {}

    def add(name, kind, detail=None):
        binds.setdefault(name, []).append((kind, detail))

    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.asname or a.name.split(".")[0], "import", a.name if a.asname else a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                add(a.asname or a.name, "from", (node.module, a.name, node.level))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kind = "class" if isinstance(node, ast.ClassDef) else "def"
            add(node.name, kind if not node.decorator_list else "decorated")
            continue
        elif isinstance(node, ast.ExceptHandler) and node.name:
            add(node.name, "assign")
        for child in ast.iter_child_nodes(node):  # compound statements, and every name stored at top level
            if isinstance(child, ast.stmt) or isinstance(child, ast.ExceptHandler):
                todo.append(child)
            elif not isinstance(child, scopes):
                for n in walk_outside(child, scopes):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        add(n.id, "assign")
    for n in ast.walk(tree):
        if isinstance(n, ast.Global):
            for name in n.names:
                add(name, "global")
    text = src.decode("utf-8", "replace") if isinstance(src, bytes) else src
    return binds, any(d in text for d in DYNAMIC)


def walk_outside(node, scopes):
    """`ast.walk`, not entering nested functions, classes and lambdas."""
    import ast

    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        todo.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, scopes))


class Names:
    """`tampered(module, path)`: the names of a test module that code other than the test's
    has bound (see the module's docstring), at most a few."""

    def __init__(self, repo, tag_of=None):
        import builtins

        self.repo, self.builtins = repo, builtins
        self.rewrite = sys.modules.get("_pytest.assertion.rewrite")  # what pytest's `@pytest_ar` is
        self.tag_of = tag_of or (lambda g: None)  # a view of a dict's version tag (`lg_writes`), or None
        self.prepare = lambda: None  # wraps the honest writers loaded by now (`Writers.wrap_mock`)
        self.sources = {}  # path -> (binds, dynamic) | None
        self.first = {}  # id(module dict) -> (dict, {name: value}, {import-bound name: its target}) remembered
        self.ours = {}  # id -> a recorder's wrapper of a test function (kept alive: ids stay unique)
        self.paths = {}  # id(namespace) -> its file, for the check at each comparison (`at_compare`)
        self.clean = {}  # id(namespace) -> a copy of it when it was last found untampered
        self.tags = {}  # id(namespace) -> a view of its version tag (None: cannot be read)
        self.expected = {}  # id(namespace) -> its version tag when it was last found untampered
        self.honest = {}  # id(namespace) -> {name: value} the test's own patches bound (`lg_writes`)

    def source(self, path):
        if path not in self.sources:
            try:
                with open(path, "rb") as f:
                    self.sources[path] = bindings(f.read(), path)
            except Exception:
                self.sources[path] = None
        return self.sources[path]

    def remember(self, module, path):
        """The module's names as they are now, and what its imports are bound to (taken when
        collection ends, before any fixture of a test monkeypatches a module it imports from).
        Its `__warningregistry__` is made now: a warning raised for it later writes no name."""
        g = namespace(module)
        src = self.source(path)
        if not isinstance(g, dict) or (id(g) in self.first and self.first[id(g)][0] is g):
            return
        self.prepare()
        g.setdefault("__warningregistry__", {})
        made = {}
        for name, kinds in src[0].items() if src else ():
            if len(kinds) == 1 and kinds[0][0] in ("import", "from"):
                made[name] = self.made(kinds[0])
        self.first[id(g)] = (g, dict(g), made)
        self.paths[id(g)] = path
        self.tags[id(g)] = self.tag_of(g)

    def tampered(self, module, path, during=False):
        """The names package code bound (see the module's docstring): before a test (`during`
        False, after its fixtures ran) and as it ends. A name the test's own patches bound
        (`honest`) is not counted; any other rebinding is, whatever its value; and as a test
        ends, a write since the last check that left every value as it was."""
        g = namespace(module)
        if not isinstance(g, dict):
            return []
        self.remember(module, path)
        return self.verdict(g, path, "end" if during else "start")

    def at_compare(self, g):
        """The names of a remembered test namespace `g`, at one of its comparisons: nothing
        when it was not written since its last clean check (its version tag, ~0.1 µs; else an
        identity scan, a few microseconds), else the full check."""
        first = self.first.get(id(g))
        if first is None or first[0] is not g or not self.moved(id(g), g):
            return []
        return self.verdict(g, self.paths[id(g)], "compare")

    def verdict(self, g, path, when):
        gid = id(g)
        bad = self.check(g, path, self.first[gid])
        if when != "start" and not bad:
            bad = self.restored(g, path)
        if when == "end":
            self.honest.pop(gid, None)  # the test's patches are undone as it tears down
        if bad:
            self.clean[gid] = self.expected[gid] = None
        else:
            self.baseline(gid, g)
        return bad

    def baseline(self, gid, g):
        view = self.tags.get(gid)
        self.expected[gid] = view.value if view is not None else None  # (the tag before the copy)
        self.clean[gid] = dict(g)

    def moved(self, gid, g):
        """Was namespace `g` written since its last clean check?"""
        clean = self.clean.get(gid)
        if clean is None:
            return True
        view = self.tags.get(gid)
        if view is not None:
            return view.value != self.expected.get(gid)
        if len(clean) != len(g):
            return True
        get = clean.get
        for k, v in g.items():
            if get(k, clean) is not v:
                return True
        return False

    def restored(self, g, path):
        """[WRITTEN] when `g` was written since its last check and every value is back: a
        stand-in bound for a while (a file whose own code writes its globals may do this
        itself: not counted there)."""
        gid = id(g)
        clean, view = self.clean.get(gid), self.tags.get(gid)
        if clean is None or view is None or view.value == self.expected.get(gid):
            return []
        src = self.source(path)
        if src is None or src[1] or any(("global", None) in kinds for kinds in src[0].values()):
            return []
        if len(clean) == len(g) and all(clean.get(k, clean) is v for k, v in g.items()):
            return [WRITTEN]
        return []

    def settle(self):
        """(path, name) for each remembered namespace written since its last check, judged
        now: a writer about to run (`lg_writes`) answers only for what it writes itself."""
        out = []
        for gid, (g, _, _) in list(self.first.items()):
            if self.clean.get(gid) is not None and self.moved(gid, g):
                out += [(self.paths[gid], n) for n in self.verdict(g, self.paths[gid], "compare")]
        return out

    def written(self, honest):
        """After a writer ran: what it changed in each namespace is the test's own when the
        call was (`honest`); a restore is fine where it puts back a value the name had when
        collection ended or the test's own patch bound. Anything else stays unexplained."""
        for gid, (g, before, _) in list(self.first.items()):
            clean = self.clean.get(gid)
            if clean is None or not self.moved(gid, g):
                continue
            own, ok = self.honest.setdefault(gid, {}), True
            for k in set(g) | set(clean):
                v = g.get(k, MISSING)
                if v is clean.get(k, MISSING):
                    continue
                if honest:
                    own[k] = v
                elif v is not before.get(k, MISSING) and own.get(k, MISSING) is not v:
                    ok = False
            if ok:
                self.baseline(gid, g)

    def check(self, g, path, first):
        src = self.source(path)
        bad = []
        if "__lg_probe__" in g:
            bad.append("__lg_probe__")
        b = g.get("__builtins__")
        if b is not None and b is not self.builtins and b is not vars(self.builtins):
            bad.append("__builtins__")
        if src is None:
            return bad
        binds, dynamic = src
        _, before, made = first
        own = self.honest.get(id(g)) or {}
        rewrite = {"@py_builtins": self.builtins, "@pytest_ar": self.rewrite}
        for name, val in list(g.items()):
            if name in MODULE_ATTRS or name == "__lg_probe__" or own.get(name, MISSING) is val:
                continue  # (a name the test's own patch bound: a monkeypatch, a mock.patch)
            if name.startswith("@"):  # pytest's assertion rewrite binds these two modules
                want = rewrite.get(name)
                if want is not None and val is not want:
                    bad.append(name)
                continue
            kinds = binds.get(name)
            if kinds is None:
                if not dynamic:
                    bad.append(name)
                continue
            if len(kinds) == 1 and not self.as_bound(kinds[0], name, val, g, path, dynamic, made):
                bad.append(name)
            elif (
                not dynamic
                and ("global", None) not in kinds
                and name in before
                and rebound(val, before[name])
                and not self.own(val, g, path)
            ):
                bad.append(name)
        return bad[:5]

    def made(self, kind_detail):
        """What an import binds its name to, now (None: cannot tell)."""
        kind, detail = kind_detail
        if kind == "import":
            return sys.modules.get(detail)
        module, attr, level = detail
        mod = sys.modules.get(module) if module and not level else None
        if mod is None:
            return None
        real = getattr(mod, attr, None)
        return real if real is not None else sys.modules.get(module + "." + attr)

    def as_bound(self, kind_detail, name, val, g, path, dynamic, made):
        """Is `val` what the source's one binding of `name` makes?"""
        kind, _ = kind_detail
        if kind in ("import", "from"):
            real = made.get(name) if made.get(name) is not None else self.made(kind_detail)
            if kind == "from" and not (callable(val) or isinstance(val, type(sys))):
                return True  # data may be updated by the module it came from
            return real is None or val is real
        if dynamic:
            return True
        if kind == "def":
            if self.ours.get(id(val)) is val:
                return True
            code = getattr(val, "__code__", None)
            return code is not None and same_file(code.co_filename, path)  # (or another of its functions)
        if kind == "class":
            # (a class made in a bare dict, as SymPy's runner execs a file, is "builtins")
            return (
                isinstance(val, type) and val.__qualname__ == name and val.__module__ == g.get("__name__", "builtins")
            )
        return True

    def own(self, val, g, path):
        """Is `val` the test file's own (a function compiled from it, a class defined in it)?"""
        if self.ours.get(id(val)) is val:
            return True
        code = getattr(val, "__code__", None)
        if code is not None:
            return same_file(code.co_filename, path)
        return isinstance(val, type) and val.__module__ == g.get("__name__", "builtins")


MISSING = object()
WRITTEN = "(written and put back)"  # what `Names.restored` reports: no one name is left to name


def namespace(module):
    """The names of a test file: a module's `__dict__`, or the dict itself (SymPy's runner)."""
    if isinstance(module, dict):
        return module
    return getattr(module, "__dict__", None) if module is not None else None


def rebound(val, old):
    """Is `val` another value than `old` (an equal number or string made anew is not)?"""
    if val is old:
        return False
    try:
        return not (type(val) is type(old) and type(val) in (int, float, str, bytes, bool) and val == old)
    except Exception:
        return True


def same_file(a, b):
    return a == b or os.path.realpath(a) == os.path.realpath(b)
