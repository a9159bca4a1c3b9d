"""The legorl package's import graph has no cycle.

A cycle between modules means neither can be read (or changed) without the other, and at
worst one of them meets the other half-initialised. The graph is read from the source with
`ast`, never by importing anything: an edge A → B for every `import legorl.B` /
`from legorl.B import x` / relative import in A, wherever it sits (module level, inside a
function, under `if TYPE_CHECKING:`). A type-only import counts too: it is still a
dependency a reader must follow, and the package has no need of one that closes a circle.
`from legorl.pkg import name` points at the submodule `legorl.pkg.name` when there is one,
else at the package itself; a package's `__init__` is not implied by importing a submodule
(Python runs it first, so it cannot close a circle on its own).

Run it as a script to print the graph's cycles: `python tests/repo/test_import_graph.py`.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.paths import ROOT

PACKAGE = "legorl"


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name → source file, for every module of `package` under `root`."""
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _targets(node: ast.AST, here: str, is_package: bool, known: dict[str, Path]) -> Iterator[str]:
    """The package's modules that one import statement in module `here` reaches."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in known:  # `import legorl.a.b` names a module (or a package)
                name = name.rpartition(".")[0]
            if name:
                yield name
    elif isinstance(node, ast.ImportFrom):
        if node.level:  # relative: from the module's own package, `level - 1` packages up
            base = here.split(".") if is_package else here.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        if source not in known:
            return
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            yield sub if sub in known else source


def graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports (every import statement, anywhere in it)."""
    known = modules(root, package)
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        edges[name] = {t for node in ast.walk(tree) for t in _targets(node, name, is_package, known) if t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path that returns to its start) per strongly connected component of
    more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [_loop_in(c, edges) for c in components]


def _loop_in(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside it."""
    members = set(component)
    first = component[0]
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(edges[node] & members):
                if child == first:
                    return [*paths[node], first]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"{component} is not strongly connected")


def test_the_checker_finds_a_cycle_and_reads_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    from .. import a\n")
    (pkg / "d.py").write_text("import pkg.a\nfrom pkg.sub.c import f\n")
    edges = graph(tmp_path, "pkg")
    assert edges["pkg.a"] == {"pkg.sub.b"}
    assert edges["pkg.sub.b"] == {"pkg.sub.c"}  # a type-only import is an edge
    assert edges["pkg.sub.c"] == {"pkg.a"}  # a function's import is an edge; `..` is the package above
    assert edges["pkg.d"] == {"pkg.a", "pkg.sub.c"}
    assert cycles(edges) == [["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]]
    (pkg / "sub" / "c.py").write_text("def f():\n    from pkg import sub\n")  # the package itself
    edges = graph(tmp_path, "pkg")
    assert edges["pkg.sub.c"] == {"pkg.sub"} and cycles(edges) == []


def test_the_legorl_package_has_no_import_cycle() -> None:
    edges = graph()
    assert "legorl.harness.base" in edges and "legorl.loop.worker" in edges  # it read the package
    found = cycles(edges)
    assert not found, "import cycles: " + "; ".join(" → ".join(c) for c in found)


if __name__ == "__main__":
    found = cycles(graph())
    for c in found:
        print(" → ".join(c))
    sys.exit(1 if found else 0)
