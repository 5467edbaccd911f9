"""No import cycles among the product modules (tracer/, backend/, ui/, integrations/).

Every import counts, wherever it is written: at module level, inside functions (the CLI's lazy imports) and under
`if TYPE_CHECKING:`, because a cycle through any of them still ties the modules into one unit that cannot be read,
tested or layered apart. The graph is built from the source with `ast` (nothing is imported), and its strongly
connected components are found with Tarjan's algorithm.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("tracer", "backend", "ui", "integrations")  # installed as specscope.<name> (pyproject package-dir)
DIST = "specscope"

Graph = dict[str, set[str]]


def product_modules(root: Path = REPO) -> dict[str, Path]:
    """Module name (as under `specscope.`, e.g. `tracer.export.bundle`; a package by its own name) -> its file."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = f
    return out


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name` itself when it is a product module, else its longest prefix that is one (None: outside the product)."""
    parts = name.split(".")
    if parts[0] == DIST:
        parts = parts[1:]
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts = parts[:-1]
    return None


def _imported(module: str, is_package: bool, tree: ast.AST) -> Iterator[str]:
    """Every name an import in `tree` can bind a module to (absolute, without resolving what exists)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):  # every depth: functions, TYPE_CHECKING blocks, try/except
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # `..` from a top-level package (`backend`) is the distribution root, which names drop.
                base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(p for p in (*base_parts, node.module or "") if p)
            else:
                target = node.module or ""
            # `from pkg import name`: name is a submodule (imported as one) or else an attribute of pkg, which the
            # longest-known-prefix lookup then resolves to pkg.
            yield from (f"{target}.{a.name}" for a in node.names)


def import_graph(root: Path = REPO) -> Graph:
    """Module -> the product modules it imports (self-imports dropped)."""
    modules = product_modules(root)
    graph: Graph = {m: set() for m in modules}
    for m, f in modules.items():
        tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        for name in _imported(m, f.name == "__init__.py", tree):
            dep = _known(name, modules)
            if dep is not None and dep != m:
                graph[m].add(dep)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out)


def a_cycle(graph: Graph, component: Iterable[str]) -> list[str]:
    """One concrete loop through a component, for the failure message: [a, b, ..., a]."""
    members = set(component)
    first = min(members)
    paths = {first: [first]}
    queue = [first]
    while queue:  # breadth first from `first` inside the component, until an edge leads back to it
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == first:
                return [*paths[v], first]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return sorted(members)


def test_product_modules_have_no_import_cycles() -> None:
    graph = import_graph()
    bad = cycles(graph)
    loops = "\n".join(" -> ".join(a_cycle(graph, c)) for c in bad)
    assert not bad, f"import cycles (imports inside functions and TYPE_CHECKING blocks count):\n{loops}"


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    files = {
        "tracer/__init__.py": "",
        "tracer/base.py": "",
        "tracer/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .base import X\n",
        "tracer/lazy.py": "def f() -> None:\n    from specscope.tracer.base import X\n",
        "tracer/sub/__init__.py": "",
        "tracer/sub/deep.py": "from .. import base, typed\nfrom . import sibling\nimport specscope.tracer.lazy as lz\n",
        "tracer/sub/sibling.py": "from ..base import name_in_base\n",
        "ui/__init__.py": "",
        "ui/cmd.py": "from specscope.tracer import sub\nfrom ..tracer.sub import deep\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph["tracer.typed"] == {"tracer.base"}  # under `if TYPE_CHECKING:`
    assert graph["tracer.lazy"] == {"tracer.base"}  # inside a function, absolute through the distribution name
    assert graph["tracer.sub.deep"] == {"tracer.base", "tracer.typed", "tracer.sub.sibling", "tracer.lazy"}
    assert graph["tracer.sub.sibling"] == {"tracer.base"}  # a name in a module: the module
    assert graph["ui.cmd"] == {"tracer.sub", "tracer.sub.deep"}  # a package; a submodule through `..`
    assert graph["tracer.base"] == set() and graph["tracer"] == set()
    real = import_graph()
    assert "tracer.attention_call" in real["ui.cmd_replay"]  # the real tree: run()'s lazy imports
    assert "tracer.user_env" in real["backend.streams"]  # `from ..tracer import user_env`


def test_the_search_finds_cycles_and_names_them() -> None:
    graph: Graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}, "g": {"f"}}
    assert cycles(graph) == [["a", "b", "c"], ["f", "g"]]
    assert a_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
