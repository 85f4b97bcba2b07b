"""Dependencies point one way (DESIGN.md, Layers): a store never imports upward, the derived
index (``terrarium.index``) sits between the stores and the surfaces, and the
lifecycle feature (``terrarium.states``, ``terrarium.lifecycle``) is in no import circle.

Imports are read from each module's syntax tree, those inside functions too, so a deferred
``from terrarium.search import scan`` counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "terrarium"

#: What a store may import from the package: itself and the layers below it.
BELOW_STORES = frozenset({"stores", "model", "codec", "blobrefs", "errors", "text", "_lazy"})


def _module(path: Path) -> str:
    parts = ["terrarium", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _typing_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"


def _imports(path: Path, *, typing: bool = False) -> set[str]:
    """The ``terrarium`` modules ``path`` imports, anywhere in it (under ``if TYPE_CHECKING:``
    only with ``typing``)."""
    found: set[str] = set()
    todo: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("terrarium"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("terrarium"):
            base = node.module or ""
            for alias in node.names:  # a submodule, or a name of the module ``base``
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        todo.extend(c for c in ast.iter_child_nodes(node) if typing or not _typing_only(c))
    return found


def _graph(*, typing: bool = False) -> dict[str, set[str]]:
    return {
        name: _imports(path, typing=typing) & MODULES.keys() - {name}
        for name, path in MODULES.items()
    }


def test_no_store_module_imports_a_layer_above_the_stores() -> None:
    """Every ``terrarium`` import under ``stores/`` names the stores or a layer below them."""
    upward = {
        f"{_module(path)} -> {name}"
        for path in (PACKAGE / "stores").rglob("*.py")
        for name in _imports(path)
        if name != "terrarium" and name.split(".")[1] not in BELOW_STORES
    }
    assert upward == set()


def test_the_layers_below_the_stores_import_no_store() -> None:
    """What the stores may import is below them: none of it imports ``terrarium.stores``."""
    below = {
        name: imports
        for name, imports in _graph().items()
        if name.count(".") and name.split(".")[1] in BELOW_STORES - {"stores"}
    }
    assert below  # the modules exist under these names
    assert {
        name for name, imports in below.items() if any(".stores" in i for i in imports)
    } == set()


def test_the_lifecycle_feature_is_in_no_import_circle() -> None:
    """Nothing that ``terrarium.states`` or ``terrarium.lifecycle`` imports, directly or not,
    imports either of them back (``contexts`` and ``lifecycle`` imported each other)."""
    graph = _graph()
    for start in ("terrarium.states", "terrarium.lifecycle"):
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(graph.get(name, ()))
        assert start not in seen, f"{start} imports itself through its imports"


def test_the_session_log_imports_no_layer_above_it() -> None:
    """``terrarium.sessions`` (the log's API and its replay rule) imports only the stores, the
    blobs above them and the layers below: legacy files are read above it
    (``contexts.check_new_name``)."""
    allowed = {*BELOW_STORES, "sessions", "blobs"}
    above = {
        name
        for name in _imports(MODULES["terrarium.sessions"])
        if name != "terrarium" and name.split(".")[1] not in allowed
    }
    assert above == set()


def test_the_derived_index_sits_between_the_stores_and_the_surfaces() -> None:
    """``terrarium.index`` imports only the stores, the session log (``sessions``: its replay
    rule folds the figures the index keeps) and the layers below them (the surfaces above ask
    it for a store's index), and no store imports it."""
    index_modules = {name for name in MODULES if name.split(".")[:2] == ["terrarium", "index"]}
    above = {
        f"{module} -> {name}"
        for module in index_modules
        for name in _imports(MODULES[module])
        if name != "terrarium" and name.split(".")[1] not in {*BELOW_STORES, "index", "sessions"}
    }
    assert index_modules and above == set()
    assert not any(
        name.startswith("terrarium.index")
        for path in (PACKAGE / "stores").rglob("*.py")
        for name in _imports(path)
    )


def test_the_package_has_no_import_circle() -> None:
    """No module of ``terrarium`` imports, directly or not, a module that imports it back
    (imports inside functions count, and ``if TYPE_CHECKING:`` ones: a type's import is still
    a dependency a reader follows)."""
    graph = _graph(typing=True)
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            circle = [*path[path.index(name) :], name]
            raise AssertionError("import circle: " + " -> ".join(circle))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
