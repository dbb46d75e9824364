"""The house's rules, checked on the source: the layers of docs/architecture.md, no import
cycle, no underscore name used across modules, and small functions.

The layers are read from the ``layers`` block of docs/architecture.md: one line per layer,
top first, ``name: module patterns``.  A module may import its own layer and the layers
below it, never one above.  Every import statement counts, lazy ones inside functions
too; only ``if TYPE_CHECKING:`` blocks are left out (they never run)."""

import ast
import fnmatch
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("ackqueue", "benchmarks")
LIMITS = {"ackqueue": 60, "benchmarks": 80}

# Underscore attributes that belong to a base class outside the package (the module
# subclasses it and reads its own inherited state) or to a library's documented
# protocol; each is (module, attribute): why.
FOREIGN = {
    ("ackqueue.filestorage", "_lock"):
        "ZODB FileStorage's own storage lock, read by its subclasses",
    ("ackqueue.filestorage", "_cond"):
        "ZODB's FilePool condition, which the pool subclass waits on",
    ("ackqueue.filestorage", "_out"):
        "ZODB's FilePool list of files handed out, which the pool subclass counts",
}


def _modules(package):
    """{dotted name: path} of every module of ``package``."""
    base = ROOT / package
    found = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    assert found, f"no modules under {base}"
    return found


def _tree(path):
    return ast.parse(path.read_text(), str(path))


def _type_checking_nodes(tree):
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    return skipped


def _owner(name, modules):
    """The module of ``modules`` that ``name`` (a dotted import target) lands in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports(package):
    """{module: {modules of the package it imports}}, every import statement."""
    modules = _modules(package)
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        tree = _tree(path)
        skipped = _type_checking_nodes(tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = name.split(".")
                    keep = len(parts) - node.level + (1 if is_package else 0)
                    base = ".".join(parts[:keep] + ([node.module] if node.module else []))
                else:
                    base = node.module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                owner = _owner(target, modules)
                if owner and owner != name:
                    graph[name].add(owner)
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    assert cycles(imports(package)) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def layers():
    """[(layer name, [module patterns])], top first, from docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    rows = []
    for line in block.group(1).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, patterns = line.partition(":")
            rows.append((name.strip(), patterns.split()))
    return rows


def layer_of(module, rows):
    """The rank of ``module``'s layer (0 is the top), by its most specific pattern."""
    best = None
    for rank, (_, patterns) in enumerate(rows):
        for pattern in patterns:
            if fnmatch.fnmatchcase(module, pattern):
                if best is None or len(pattern) > best[1]:
                    best = (rank, len(pattern))
    return None if best is None else best[0]


def test_every_module_has_a_layer():
    rows = layers()
    assert [m for m in _modules("ackqueue") if layer_of(m, rows) is None] == []


def test_no_module_imports_a_layer_above_its_own():
    rows = layers()
    upward = []
    for module, targets in imports("ackqueue").items():
        for target in targets:
            if layer_of(target, rows) < layer_of(module, rows):
                upward.append(f"{module} ({rows[layer_of(module, rows)][0]}) imports "
                              f"{target} ({rows[layer_of(target, rows)][0]})")
    assert sorted(upward) == []


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _bound(tree):
    """Underscore names a module binds: defs, classes, assignments, arguments, slots."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "setattr" and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)):
            names.add(node.args[1].value)
    return {name for name in names if isinstance(name, str) and _private(name)}


def private_uses(package):
    """Underscore names a module imports from, or reads off, another module's objects."""
    modules = _modules(package)
    trees = {name: _tree(path) for name, path in modules.items()}
    bound = {name: _bound(tree) for name, tree in trees.items()}
    anywhere = set().union(*bound.values())
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                    node.level or (node.module or "").split(".")[0] == package):
                found += [f"{name}:{node.lineno} imports {a.name}"
                          for a in node.names if _private(a.name)]
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                  and _private(node.attr) and node.attr not in bound[name]
                  and node.attr in anywhere and (name, node.attr) not in FOREIGN):
                found.append(f"{name}:{node.lineno} {ast.unparse(node)[:60]}")
    return found


def test_no_underscore_name_crosses_modules():
    assert private_uses("ackqueue") == []


def test_the_private_finder_sees_an_import_and_a_reach(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("class A:\n    def __init__(self):\n        self._x = 1\n")
    (package / "b.py").write_text("from .a import _y\ndef f(a):\n    return a._x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert len(private_uses("pkg")) == 2


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_over_the_limit(package):
    long = []
    for name, path in _modules(package).items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > LIMITS[package]:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert long == []
