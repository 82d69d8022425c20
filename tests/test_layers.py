"""No import cycles between the package's modules, counting the imports made inside functions.

An import inside a function hides a cycle from the interpreter (it runs after both modules
have loaded) but not from a reader: the two modules still cannot be understood, tested or
moved apart. So every ``import`` and ``from ... import`` anywhere in a module's source is an
edge here, to the module it names (``from a.b import c`` is an edge to ``a.b`` and, where
``a/b/c.py`` exists, to ``a.b.c``; a name that is not a module goes to the nearest module
above it). A cycle is a strongly connected set of two or more modules.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hpctrain"


def module_of(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def nearest(name, modules):
    """``name`` itself if it is a module of the package, else its nearest enclosing one
    (``None`` outside the package)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported(path, modules):
    """The package's modules that the module at ``path`` imports, anywhere in its source."""
    here = module_of(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        targets.update(nearest(name, modules) for name in names)
    return targets - {None, here}


def import_graph():
    """Module -> the modules it imports. A package's ``__init__`` that imports its own
    submodules is the package's public face (``hpctrain.torch`` re-exporting its ops), not
    a layer: those edges are left out, so a submodule may import its package's public names
    without that counting as a cycle."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_of(path) for path in paths}
    graph = {}
    for path in paths:
        here, targets = module_of(path), imported(path, modules)
        if path.name == "__init__.py":
            targets = {t for t in targets if not t.startswith(here + ".")}
        graph[here] = targets
    return graph


def strongly_connected(graph):
    """Tarjan's components of ``graph`` (iterative: the package's depth is no concern)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function_and_none_in_a_chain(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert [c for c in strongly_connected(graph) if len(c) > 1] == [["a", "b", "c"]]
    assert all(len(c) == 1 for c in strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}))


def test_imports_inside_functions_and_relative_imports_are_edges(tmp_path, monkeypatch):
    package = tmp_path / "hpctrain"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "one.py").write_text("def later():\n    from .sub import two\n")
    (package / "sub" / "two.py").write_text("from .. import one\nimport os\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    graph = import_graph()
    assert graph["hpctrain.one"] == {"hpctrain.sub", "hpctrain.sub.two"}
    assert "hpctrain.one" in graph["hpctrain.sub.two"]
    assert ["hpctrain.one", "hpctrain.sub.two"] in strongly_connected(graph)


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 100, "the package's modules were not found"
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not cycles, "import cycles (each a set of modules that import one another): " + \
        "; ".join(" <-> ".join(c) for c in cycles)
