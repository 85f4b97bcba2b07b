"""The JSON API's OpenAPI document, generated from the app's route table.

:func:`api` records a handler's summary and query parameters, so the document cannot drift
from the routes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from starlette.routing import BaseRoute, Route

from terrarium import __version__

F = TypeVar("F", bound=Callable[..., Any])

_TYPES = {"str": "string", "int": "integer"}


def api(summary: str, **params: str) -> Callable[[F], F]:
    """Mark a handler as part of the JSON API; each keyword is ``"type: description"``."""

    def mark(fn: F) -> F:
        fn.__api__ = (summary, params)  # type: ignore[attr-defined]
        return fn

    return mark


def _operation(summary: str, params: dict[str, str]) -> dict[str, Any]:
    parameters = []
    for name, spec in params.items():
        kind, _, description = spec.partition(":")
        parameters.append(
            {
                "name": name,
                "in": "query",
                "required": "(required)" in description,
                "description": description.strip(),
                "schema": {"type": _TYPES[kind.strip()]},
            }
        )
    return {
        "summary": summary,
        "parameters": parameters,
        "responses": {
            "200": {"description": "OK"},
            "400": {"description": 'a parameter cannot be used: {"error": ...}'},
            "404": {"description": 'no such context or segment: {"error": ...}'},
        },
    }


def openapi_document(routes: Iterable[BaseRoute]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route whose handler is marked with :func:`api`."""
    paths: dict[str, Any] = {}
    for route in routes:
        marked = getattr(getattr(route, "endpoint", None), "__api__", None)
        if not isinstance(route, Route) or marked is None:
            continue
        methods = sorted(m.lower() for m in (route.methods or {"GET"}) if m != "HEAD")
        paths[route.path] = {m: _operation(*marked) for m in methods}
    return {
        "openapi": "3.1.0",
        "info": {"title": "terrarium dashboard API", "version": __version__},
        "paths": paths,
    }
