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
