"""No import cycles between the package's modules, counting the imports made inside functions;
and no import against the layer table of docs/architecture.md.

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


def imported(path, modules, outside=False):
    """The package's modules that the module at ``path`` imports, anywhere in its source;
    with ``outside``, also the outside packages it imports (their top-level names)."""
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
        if outside and not any(nearest(name, modules) for name in names):
            targets.update(name.split(".")[0] for name in names if name)
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


# --- the layer table of docs/architecture.md ---------------------------------------------------

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def layer_table(text):
    """The rows of the table under "## The layers": ``(layer, patterns, never)``, with the
    module patterns and the never-imported names as written between backquotes."""
    section = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        quoted = [cell.split("`")[1::2] for cell in cells[2:]]
        rows.append((int(cells[0]), quoted[0], quoted[1]))
    return rows


def matches(pattern, path):
    """Whether the package file ``path`` (relative, ``train/loop.py``) is what ``pattern``
    names: a folder (``train/``: every module in it), a file, or ``*/name.py`` (that file in
    any folder)."""
    if pattern.endswith("/"):
        return path.startswith(pattern)
    if pattern.startswith("*/"):
        return "/" in path and path.rsplit("/", 1)[1] == pattern[2:]
    return path == pattern


def row_of(path, rows):
    """The one row whose patterns name ``path`` (a file's own name beats its folder's)."""
    exact = [row for row in rows if any(matches(p, path) and not p.endswith("/")
                                        for p in row[1])]
    found = exact or [row for row in rows if any(matches(p, path) for p in row[1])]
    assert len(found) == 1, f"hpctrain/{path} is in {len(found)} rows of the layer table " \
        f"of docs/architecture.md (it must be in exactly one): {[r[1] for r in found]}"
    return found[0]


def layer_breaches(package, text):
    """Each import against the table: ``(importer, imported, why)``."""
    rows = layer_table(text)
    paths = sorted(package.rglob("*.py"))
    modules = {module_of(path): path for path in paths}
    relative = {name: path.relative_to(package).as_posix() for name, path in modules.items()}
    breaches = []
    for path in paths:
        here = module_of(path)
        layer, _, never = row_of(relative[here], rows)
        for target in sorted(imported(path, set(modules), outside=True)):
            if target not in modules:   # an outside package
                if target in never:
                    breaches.append((here, target, "its row never imports it"))
                continue
            if path.name == "__init__.py" and target.startswith(here + "."):
                continue                 # a package's face re-exporting its own modules
            target_path = relative[target]
            target_layer = row_of(target_path, rows)[0]
            if target_layer > layer:
                breaches.append((here, target, f"layer {layer} imports layer {target_layer}"))
            elif any(matches(p, target_path) for p in never):
                breaches.append((here, target, "its row never imports it"))
    return breaches


def test_the_layer_check_finds_an_import_up_a_layer_and_one_its_row_forbids(tmp_path,
                                                                           monkeypatch):
    package = tmp_path / "hpctrain"
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    (package / "low").mkdir(parents=True)
    for name in ("__init__.py", "top.py", "low/__init__.py", "low/base.py", "side.py"):
        (package / name).write_text("")
    (package / "low" / "base.py").write_text("def later():\n    from .. import top\n")
    (package / "side.py").write_text("import torch\n")
    table = ("## The layers\n\n| layer | what | modules | never imports |\n|---|---|---|---|\n"
             "| 2 | top | `top.py`, `side.py` | `torch` |\n"
             "| 1 | base | `__init__.py`, `low/` | |\n\n## Next\n")
    assert layer_breaches(package, table) == [
        ("hpctrain.low.base", "hpctrain.top", "layer 1 imports layer 2"),
        ("hpctrain.side", "torch", "its row never imports it")]
    (package / "stray.py").write_text("")
    try:
        layer_breaches(package, table)
    except AssertionError as error:
        assert "hpctrain/stray.py is in 0 rows" in str(error)
    else:
        raise AssertionError("a module in no row of the table was not reported")


def test_every_import_keeps_to_the_layer_table_of_the_architecture_doc():
    text = ARCHITECTURE.read_text()
    assert len(layer_table(text)) >= 8, "the layer table of docs/architecture.md was not read"
    breaches = layer_breaches(PACKAGE, text)
    assert not breaches, "imports against docs/architecture.md's layer table:\n" + "\n".join(
        f"  {a} imports {b}: {why}" for a, b, why in breaches)
