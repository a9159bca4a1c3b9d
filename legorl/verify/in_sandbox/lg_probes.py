"""Equality probes: every value a test compares with `==`/`!=` (a rewritten assert, unittest's
`assertEqual`) goes through `Watch.probe` first, which notes an "always equal" object of the
agent's code; the comparison's result and pytest's explanations are unchanged.

Part of the grading supervisor (`pytest_main.py`, `native_main.py` and the `lg_*` modules beside
them, copied into the grading sandbox together): stdlib only, run by the image's Python, never
imports legorl.
"""


def probe_comparisons(tree):
    """Wrap each operand of `==`/`!=` (and of `<`, `<=`, `>`, `>=`) in a test module's code in
    `__lg_probe__(...)` (a builtin the recorder adds), so every value a test compares is checked by `Watch.probe`; the
    comparison's result and pytest's explanations of a failing assert are unchanged."""
    import ast

    COMPARED = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)

    class _T(ast.NodeTransformer):
        def visit_Compare(self, node):
            self.generic_visit(node)
            if any(isinstance(op, COMPARED) for op in node.ops):
                wrap = lambda e: ast.copy_location(  # noqa: E731
                    ast.Call(func=ast.Name(id="__lg_probe__", ctx=ast.Load()), args=[e], keywords=[]), e
                )
                node.left = wrap(node.left)
                node.comparators = [wrap(c) for c in node.comparators]
            return node

    tree = _T().visit(tree)
    ast.fix_missing_locations(tree)
    return tree


ASSERTS = (
    "assertEqual",
    "assertNotEqual",
    "assertAlmostEqual",
    "assertNotAlmostEqual",
    "assertCountEqual",
    "assertSequenceEqual",
    "assertListEqual",
    "assertTupleEqual",
    "assertDictEqual",
    "assertSetEqual",
    "assertMultiLineEqual",
    "assertGreater",
    "assertGreaterEqual",
    "assertLess",
    "assertLessEqual",
)


def probe_assert_equal(case_cls, watch):
    """unittest's comparing assertions check their operands with `watch.probe` first, and the
    test module's names as they compare: a stand-in bound for the test's calls and put back
    before the test ends is seen while it is bound."""
    import sys

    for name in ASSERTS:
        real = vars(case_cls).get(name)
        if real is None:
            continue

        def checked(self, first, second, *a, _real=real, **kw):
            watch.probe(first)
            watch.probe(second)
            mod = sys.modules.get(type(self).__module__)
            if getattr(mod, "__file__", None) in watch.tests:  # names swapped for this comparison only
                for name in watch.names.at_compare(vars(mod)):
                    watch.note("test_globals:%s:%s" % (watch.rel(mod.__file__), name))
            return _real(self, first, second, *a, **kw)

        checked.__name__ = checked.__qualname__ = name
        setattr(case_cls, name, checked)


def probe_rewrites(watch):
    """pytest's assertion rewrite, after every operand of == / != is routed through the probe
    (`probe_comparisons`), and the probe as the builtin those calls name."""
    import builtins

    import _pytest.assertion.rewrite as assert_rewrite

    pytest_rewrite = assert_rewrite.rewrite_asserts

    def rewrite_asserts(mod, source, module_path=None, config=None):
        return pytest_rewrite(probe_comparisons(mod), source, module_path, config)

    assert_rewrite.rewrite_asserts = rewrite_asserts
    builtins.__lg_probe__ = watch.probe
