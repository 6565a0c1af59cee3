"""No import cycles inside engine/ and dashboard/ (a newcomer can read the modules bottom-up).

Static: every file is parsed, never imported. An import anywhere in a file counts — at module
level, inside a function (a lazy import), or under `if TYPE_CHECKING:` — because a lazy or
type-only import is still a dependency a reader must follow, and a lazy import cycle is one
refactoring away from an ImportError at start-up. `from P import name` points at the submodule
`P.name` where that is a module, else at `P` itself; the implicit import of a parent package's
`__init__` is not counted (a package that imports its own submodules is not a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "dashboard")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import engine.x.y` where y is a name: engine.x
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component of size > 1."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan; the graph is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for component in components:
        members, start = set(component), component[0]
        paths, seen = {start: [start]}, {start}
        frontier = [start]
        while frontier:  # breadth-first inside the component, back to `start`: a shortest cycle
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        cycles.append(paths[v] + [start])
                        nxt = []
                        break
                    if w not in seen:
                        seen.add(w)
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
                else:
                    continue
                break
            frontier = nxt
    return cycles


def test_finder_names_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_resolves_relative_and_lazy_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import f\n")
    modules = {"p": pkg / "__init__.py", "p.a": pkg / "a.py", "p.b": pkg / "b.py"}
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.a"}}
    assert find_cycles(graph) == [["p.a", "p.b", "p.a"]]


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert "engine.cli" in graph and "dashboard.app" in graph
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_only_the_cli_imports_the_cli() -> None:
    """The CLI layer parses and prints; the domain (and the dashboard) never depends on it."""
    graph = import_graph()

    def inside(name: str) -> bool:
        return name == "engine.cli" or name.startswith("engine.cli.")

    offenders = sorted(f"{m} -> {t}" for m, targets in graph.items() if not inside(m) for t in targets if inside(t))
    assert not offenders, "imports of the CLI layer from outside it: " + "; ".join(offenders)
