"""The import graph of bpf/, fcap/ and bench/ (static, from the source): no cycles, and bpf/ never imports fcap/.

Every import counts, at module level or inside a function, except those under `if TYPE_CHECKING:`. Importing
a.b.c does not count as importing a or a.b (Python runs the parents' __init__ first, which is no cycle), and
`from a import b` imports the module a.b when there is one, else module a."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bpf", "fcap", "bench")


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages (a package is its __init__.py)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) bodies."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def imported_names(name: str, path: Path) -> list[tuple[tuple[str, ...], int]]:
    """What the module imports, relative imports resolved: (candidates, line) per imported name, where the first
    candidate that is a module is the one imported. `import a.b` gives ("a.b",); `from a import b` gives
    ("a.b", "a"): the module a.b if there is one, else the name b of module a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [((alias.name,), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out += [((f"{base}.{alias.name}", base), node.lineno) for alias in node.names]
    return out


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {module of ours it imports: the line of the first such import}."""
    mods = module_files(root, packages)
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        edges = graph[name] = {}
        for candidates, line in imported_names(name, path):
            target = next((c for c in candidates if c in mods), None)
            if target is not None and target != name:
                edges.setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    """One loop through a component, with the line of each import: "a:12 -> b:3 -> a"."""
    start = component[0]
    inside = set(component)
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:  # breadth first: the shortest way back to start
        v = todo.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                path.reverse()
                steps = [f"{a}:{graph[a][b]}" for a, b in zip(path, path[1:] + [start])]
                return " -> ".join(steps + [start]) + (f"  (component: {', '.join(component)})"
                                                        if len(component) > len(path) else "")
            if w in inside and w not in came_from:
                came_from[w] = v
                todo.append(w)
    raise AssertionError(f"no loop through {start} in {component}")


# ------------------------------------------------------------------------------------------ the repository

GRAPH = import_graph()


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package):
    found = [c for c in cycles(GRAPH) if any(m == package or m.startswith(package + ".") for m in c)]
    assert not found, "import cycles (module:line of the import):\n  " + "\n  ".join(
        describe_cycle(GRAPH, c) for c in found)


def test_bpf_never_imports_fcap():
    mods = module_files(ROOT, ("bpf",))
    bad = [f"{name}:{line} imports {candidates[0]}" for name, path in mods.items()
           for candidates, line in imported_names(name, path) if candidates[-1].split(".")[0] == "fcap"]
    assert not bad, "bpf/ is a toolkit that knows nothing about packets:\n  " + "\n  ".join(bad)


def test_the_graph_is_read():
    assert {"bpf.asm", "fcap.commands.cli", "fcap.text.dissect", "fcap.text.dissect.ip", "bench.__main__"} <= set(GRAPH)
    assert "fcap.text.dissect.reader" in GRAPH["fcap.text.dissect.ip"]  # absolute, module level
    assert "fcap.text.printer" in GRAPH["fcap.commands.capture"]  # imported in a function


# ------------------------------------------------------------------------------------------ the walker itself

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_walker_finds_cycles_through_functions_and_relative_imports(tmp_path):
    root = _tree(tmp_path, {
        "p/__init__.py": "from p.a import f\n",
        "p/a.py": "from . import b\n\ndef f():\n    pass\n",
        "p/b.py": "def g():\n    from .sub import c\n",
        "p/sub/__init__.py": "",
        "p/sub/c.py": "import p.a\n",
        "p/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import e\n",
        "p/e.py": "import p.d\nfrom p.sub.c import x\n",
    })
    graph = import_graph(root, ("p",))
    assert cycles(graph) == [["p.a", "p.b", "p.sub.c"]]
    assert describe_cycle(graph, ["p.a", "p.b", "p.sub.c"]) == "p.a:1 -> p.b:2 -> p.sub.c:1 -> p.a"
    assert "p.e" not in graph["p.d"]  # only under TYPE_CHECKING
    assert graph["p"] == {"p.a": 1} and graph["p.a"] == {"p.b": 1}  # `from . import b`: the module p.b
    assert graph["p.e"] == {"p.d": 1, "p.sub.c": 2}  # `from p.sub.c import x`: a name of p.sub.c


def test_walker_names_every_cycle(tmp_path):
    root = _tree(tmp_path, {"q/__init__.py": "", "q/a.py": "import q.b\n", "q/b.py": "import q.a\n",
                            "q/c.py": "import q.d\n", "q/d.py": "\n\nfrom q import c\n", "q/e.py": "import q.a\n"})
    graph = import_graph(root, ("q",))
    assert cycles(graph) == [["q.a", "q.b"], ["q.c", "q.d"]]
    assert [describe_cycle(graph, c) for c in cycles(graph)] == ["q.a:1 -> q.b:1 -> q.a", "q.c:1 -> q.d:3 -> q.c"]


def test_the_host_floor_imports_nothing_above_it():
    """fcap.host (what the host says of a packet: kallsyms, cgroups and containers, nf_tables) is a floor below
    fcap.kernel: of fcap it imports only itself and fcap.errors."""
    graph = import_graph()
    host = [m for m in graph if m == "fcap.host" or m.startswith("fcap.host.")]
    assert len(host) >= 6
    above = {m: sorted(t for t in graph[m] if t.split(".")[0] == "fcap" and not t.startswith("fcap.host")
                       and t not in ("fcap", "fcap.errors")) for m in host}
    assert not any(above.values()), above


def test_the_features_floor_imports_nothing_above_it():
    """fcap.features (the per-packet features as units) stands above fcap.kernel, fcap.host and fcap.text and below
    what runs a capture: it imports no module of fcap.live, fcap.commands or fcap.api."""
    graph = import_graph()
    units = [m for m in graph if m.startswith("fcap.features.")]
    assert len(units) >= 8
    above = {m: sorted(t for t in graph[m] if t.startswith(("fcap.live", "fcap.commands", "fcap.api"))) for m in units}
    assert not any(above.values()), above
