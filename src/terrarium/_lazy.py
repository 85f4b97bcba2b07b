"""Package namespaces that import a submodule only when one of its names is first used.

``import terrarium`` must not pay for what a caller never touches: the ``openai`` client (the
runtime), ``psycopg`` (an optional extra), every store backend, ``sqlite3``. A package lists
its public names with the module each comes from; :func:`attach` gives it the module-level
``__getattr__`` (PEP 562) that imports that module on first access and caches the value in
the package's namespace, and a ``__dir__`` that shows only the public names. Usage::

    __getattr__, __dir__ = attach(__name__, {"FsStore": "terrarium.stores.fs"}, __all__)
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

TYPE_CHECKING = False  # not typing's: importing typing costs more than this whole module
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any


def attach(
    package: str, names: Mapping[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's ``__name__``.
        names: each lazily imported name, and the module that defines it.
        public: the names ``dir()`` shows (the package's ``__all__``).
    """
    shown = sorted(public)

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # the next access skips this function
        return value

    def __dir__() -> list[str]:
        return list(shown)

    return __getattr__, __dir__


def lazy_module(name: str) -> ModuleType:
    """Module ``name``, executed on first attribute access (:class:`importlib.util.LazyLoader`).

    For modules that import a heavy module at the top but use it only in some functions: the
    command line's modules define every command, and ``terrarium --help`` runs none of them.
    Type checkers see the real module through an ``if TYPE_CHECKING:`` import beside it::

        if TYPE_CHECKING:
            from terrarium import contexts
        else:
            contexts = lazy_module("terrarium.contexts")
    """
    import importlib.util  # here: ``import terrarium`` alone never needs it

    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)  # as an import does: ``terrarium.lifecycle``
    return module
