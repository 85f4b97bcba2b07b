"""Package namespaces that import a submodule only when one of its names is first used.

``import terrarium`` must not pay for what a caller never touches: the ``openai`` client,
``psycopg``, every store backend, ``sqlite3``. Usage::

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
    """The PEP 562 ``__getattr__`` (importing ``names[name]``) and ``__dir__`` of ``package``."""
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
