"""The dashboard's ASGI app: pages, the JSON API, live events, guarded writes.

:func:`create_app` wraps one open store. Handlers run in Starlette's thread pool; calls into
the store are serialised by one lock (a store is not promised to be safe across threads).
Safety (token, loopback ``Host``, CSP, CSRF): docs/dashboard.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from terrarium import contexts, export, lifecycle, search
from terrarium.errors import (
    ContextExists,
    ContextNotFound,
    CorruptLog,
    LLMError,
    NothingToCompact,
    NotInTrash,
    SegmentNotFound,
    StoreError,
)
from terrarium.guard import is_loopback_header, token_matches
from terrarium.index._query import SearchQuery
from terrarium.llm import ModelAccess
from terrarium.model import ContextId, display_name
from terrarium.stores.base import Lifecycle, Notifying, Store
from terrarium.web import data, render
from terrarium.web.compact import compact
from terrarium.web.openapi import api, openapi_document

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
COOKIE = "terrarium_token"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
POLL_SECONDS = 0.25
"""How often the live view polls a store that sends no change notes (files, SQLite)."""
CHECK_SHARE = 4.0
"""A live stream waits at least this many times as long as its last check took before the
next, so one open overview (0.1 s a check at 100k contexts) costs at most a fifth of a core."""
NOTE_WAIT = 1.0
"""How long one wait for a change note lasts before the stream checks its client is there."""

P = ParamSpec("P")
T = TypeVar("T")


class Guard:
    """ASGI middleware: the token (or loopback ``Host``) check and the security headers."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(Request(scope))
        if refusal is not None:
            await refusal(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _refusal(self, request: Request) -> Response | None:
        if self.token is None:
            if is_loopback_header(request.headers.get("host", "")):
                return None
            return PlainTextResponse("403: this dashboard answers only on loopback", 403)
        query = parse_qs(request.scope.get("query_string", b"").decode("latin-1"))
        if token_matches(query.get("token", [None])[0], self.token):
            rest = {k: v for k, v in query.items() if k != "token"}
            # One leading "/": "//host/x" (or "/\host/x", read alike) would leave the site.
            target = "/" + request.scope["path"].lstrip("/\\")
            query_part = "?" + urlencode(rest, doseq=True) if rest else ""
            response = RedirectResponse(target + query_part, 303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            return response
        auth = request.headers.get("authorization", "")
        bearer = auth[7:] if auth.startswith("Bearer ") else None
        if any(token_matches(t, self.token) for t in (bearer, request.cookies.get(COOKIE))):
            return None
        return PlainTextResponse(
            "401: token required (open the URL that terrarium serve printed)", 401
        )


@dataclass
class Dashboard:
    """The app's state: the store, its lock, the CSRF token, the compaction's model access."""

    store: Store
    allow_writes: bool
    location: str
    model: ModelAccess | None
    reopen: Callable[[], Store] | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    csrf: str = field(default_factory=functools.partial(secrets.token_urlsafe, 32))

    @property
    def model_url(self) -> str | None:
        """The model server a compaction asks, when compact is offered; else None."""
        return self.model.base_url if self.allow_writes and self.model else None

    def call(self, fn: Callable[Concatenate[Store, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(store, ...)`` holding the store's lock."""
        with self.lock:
            return fn(self.store, *args, **kwargs)


def _marked(snippet: str, spans: list[list[int]]) -> list[tuple[str, bool]]:
    """The snippet cut into (text, highlighted) pieces; the template escapes each."""
    pieces: list[tuple[str, bool]] = []
    at = 0
    for start, end in sorted(spans):
        if start < at:
            continue
        pieces.append((snippet[at:start], False))
        pieces.append((snippet[start:end], True))
        at = end
    pieces.append((snippet[at:], False))
    return [p for p in pieces if p[0]]


TEMPLATES = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
)
TEMPLATES.env.filters.update(
    markdown=render.markdown,
    code=render.code,
    when=render.when,
    n=render.figure,
    size=render.human_bytes,
    shown=display_name,
    q=lambda value: quote(str(value), safe=""),
    pieces=_marked,
)


def _dash(request: Request) -> Dashboard:
    dash: Dashboard = request.app.state.dashboard
    return dash


def _page(request: Request, name: str, code: int = 200, **values: Any) -> HTMLResponse:
    # The title: base.html adds "terrarium" after a page's own.
    context = {"dash": _dash(request), "title": "", **values}
    return TEMPLATES.TemplateResponse(request, name, context, status_code=code)


def _int(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise data.BadRequest(f"{name} must be a whole number, not {raw[:40]!r}") from None


def _opt(request: Request, name: str) -> str | None:
    return request.query_params.get(name) or None


# --------------------------------------------------------------------------- JSON API
# Each reads what its /api/ route returns as JSON (see _json) and its page renders.


@api(
    "Totals, per-type counts, messages per day, tokens per model, most active contexts, "
    "archived/trashed/pinned counts.",
    range="str: the chart's days: 7d, 30d (default), 90d or all",
    **{
        "from": "str: the chart's first day (YYYY-MM-DD; wins over range)",
        "to": "str: the chart's last day (YYYY-MM-DD; default today)",
    },
)
def api_stats(request: Request) -> dict[str, Any]:
    start, end = _opt(request, "from"), _opt(request, "to")
    return _dash(request).call(data.overview, range=_opt(request, "range"), start=start, end=end)


@api(
    "One page of contexts, filtered and sorted, with the next page's cursor.",
    type="str: only this type",
    q="str: text in the context id",
    since="str: last active on or after (YYYY-MM-DD)",
    until="str: last active on or before (YYYY-MM-DD)",
    sort="str: last_active, created, messages or tokens",
    cursor="str: from next_cursor",
    limit="int: rows per page (1-1000)",
    state="str: hot (default), archived or all",
)
def api_contexts(request: Request) -> dict[str, Any]:
    return _dash(request).call(
        data.list_page,
        type=_opt(request, "type"),
        text=_opt(request, "q"),
        since=_opt(request, "since"),
        until=_opt(request, "until"),
        sort=request.query_params.get("sort") or "last_active",
        cursor=_opt(request, "cursor"),
        limit=_int(request, "limit", data.PAGE_SIZE),
        state=request.query_params.get("state") or "hot",
    )


@api("The trash: deleted contexts waiting to be restored or purged, newest first.")
def api_trash(request: Request) -> dict[str, Any]:
    return _dash(request).call(data.trash)


@api(
    "One context: a page of its transcript, its stats and its fork tree.",
    c="str: the context id, type:name (required)",
    segment="str: a segment id (default head)",
    offset="int: first message",
    limit="int: messages per page (1-5000)",
)
def api_context(request: Request) -> dict[str, Any]:
    return _dash(request).call(
        data.transcript,
        data.parse_context(request.query_params.get("c")),
        segment=_opt(request, "segment"),
        offset=_int(request, "offset", 0),
        limit=_int(request, "limit", data.MESSAGES_PER_PAGE),
    )


@api(
    "Search every context's history; snippets with the matched spans.",
    q="str: words to find (required)",
    type="str: only this context type",
    role="str: only this role",
    since="str: on or after this date",
    limit="int: hits (1-...)",
    all_branches="str: 1 to find hits off their context's conversation too",
)
def api_search(request: Request) -> dict[str, Any]:
    query = SearchQuery(
        text=request.query_params.get("q", ""),
        type=_opt(request, "type"),
        role=_opt(request, "role"),
        since=_opt(request, "since"),
        limit=_int(request, "limit", 50),
        all_branches=_opt(request, "all_branches") not in (None, "0", "false"),
    )
    found = _dash(request).call(search.search, query)
    wider = None if found else _dash(request).call(search.wider, query)
    return {
        "hits": [{"context": h.context, **search.hit_json(h), "url": _hit_url(h)} for h in found],
        "wider": None if wider is None else {wider[0]: wider[1]},
    }


def _hit_url(hit: search.SearchHit) -> str:
    """The transcript page that shows a hit, at its message's anchor (or its segment's)."""
    if hit.message is None:
        return "/session?" + urlencode({"c": hit.context, "segment": str(hit.segment_id)})
    offset = hit.message - hit.message % data.MESSAGES_PER_PAGE
    args = {"c": hit.context, **({"offset": offset} if offset else {})}
    return f"/session?{urlencode(args)}#m{hit.message}"


@api("This document: the API's routes and parameters, generated from the route table.")
def api_openapi(request: Request) -> dict[str, Any]:
    return openapi_document(request.app.routes)


def _json(read: Callable[[Request], dict[str, Any]]) -> Callable[[Request], JSONResponse]:
    """An /api/ route's handler: what ``read`` returns, as JSON (its :func:`api` mark kept)."""

    @functools.wraps(read)
    def handler(request: Request) -> JSONResponse:
        return JSONResponse(read(request))

    return handler


@api(
    "Download a context in one export format.",
    c="str: the context id (required)",
    format="str: " + ", ".join(export.FORMATS),
)
def api_export(request: Request) -> Response:
    context = data.parse_context(request.query_params.get("c"))
    spec = export.get_format(request.query_params.get("format") or "markdown")
    body = _dash(request).call(export.export_context, context, spec)
    filename = export.member_name(context, spec).rsplit("/", 1)[-1]
    return Response(
        body,
        media_type=spec.media_type,
        headers={"content-disposition": f"attachment; filename*=UTF-8''{quote(filename)}"},
    )


@api(
    "Server-Sent Events: 'change' whenever the context (or, without c, any) is written to.",
    c="str: a context id (default: the whole store)",
)
async def api_events(request: Request) -> StreamingResponse:
    dash = _dash(request)
    raw = request.query_params.get("c")
    context = data.parse_context(raw) if raw else None
    store = dash.store
    feed = await asyncio.to_thread(store.change_feed) if isinstance(store, Notifying) else None

    async def check() -> tuple[str, float]:
        """The signature, and how long reading it took."""
        began = time.monotonic()
        found = await asyncio.to_thread(dash.call, data.signature, context)
        return found, time.monotonic() - began

    async def stream() -> AsyncIterator[str]:
        try:
            last, spent = await check()
            yield "retry: 1000\n\n"
            while not await request.is_disconnected():
                # Wait for a store note (PostgreSQL), else the poll's interval, and at least
                # CHECK_SHARE times what the last check took.
                if feed is None:
                    await asyncio.sleep(max(POLL_SECONDS, CHECK_SHARE * spent))
                else:
                    await asyncio.sleep(CHECK_SHARE * spent)
                    if await asyncio.to_thread(feed.wait, NOTE_WAIT) is None:
                        continue
                now, spent = await check()
                if now != last:
                    last = now
                    yield "event: change\ndata: {}\n\n"
        finally:
            if feed is not None:  # off the event loop: a wait may hold the connection ~1 s
                threading.Thread(target=feed.close, daemon=True).start()

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"cache-control": "no-store"}
    )


# --------------------------------------------------------------------------- pages


def overview_page(request: Request) -> HTMLResponse:
    stats = api_stats(request)
    chart = render.bar_chart(stats["messages_per_day"], sorted(stats["per_type"]))
    return _page(
        request,
        "overview.html",
        stats=stats,
        chart=chart,
        ranges=list(data.RANGES),
        live="",
        refresh=stats["indexing"] > 0,  # reload until the index holds every session
    )


def sessions_page(request: Request) -> HTMLResponse:
    page = api_contexts(request)
    nxt = None
    if page["next_cursor"]:
        kept = {k: v for k, v in request.query_params.items() if k != "cursor"}
        nxt = "/sessions?" + urlencode({**kept, "cursor": page["next_cursor"]})
    return _page(
        request,
        "sessions.html",
        title="sessions",
        page=page,
        args=request.query_params,
        sorts=data.SORTS,
        states=data.STATES,
        next_url=nxt,
    )


def trash_page(request: Request) -> HTMLResponse:
    return _page(request, "trash.html", title="trash", found=api_trash(request))


def session_page(request: Request) -> HTMLResponse:
    view = api_context(request)
    base = {"c": view["context_id"]}
    if not view["is_head"]:
        base["segment"] = view["segment_id"]
    offset, limit, total = view["offset"], view["limit"], view["total_messages"]
    prev_url = next_url = None
    if offset > 0:
        prev_url = "/session?" + urlencode({**base, "offset": max(0, offset - limit)})
    if offset + limit < total:
        next_url = "/session?" + urlencode({**base, "offset": offset + limit})
    return _page(
        request,
        "session.html",
        title=view["context_id"],
        view=view,
        formats=list(export.FORMATS),
        prev_url=prev_url,
        next_url=next_url,
        live=view["context_id"] if view["is_head"] else None,
    )


def search_page(request: Request) -> HTMLResponse:
    args = request.query_params
    found = api_search(request) if args.get("q", "").strip() else {"hits": [], "wider": None}
    # The type list is the sessions page's: the types of one page of its listing.
    types = _dash(request).call(data.list_page, limit=1)["types"]
    branches = "/search?" + urlencode({**args, "all_branches": "1"})
    return _page(
        request, "search.html", title="search", **found, args=args, types=types, branches=branches
    )


ACTIONS = ("fork", "clear", "compact", "delete", *data.LIFECYCLE_ACTIONS, "restore")
"""What ``--allow-writes`` offers: lifecycle ones on a Lifecycle store, compact with a model."""


def _writes(dash: Dashboard) -> None:
    if not dash.allow_writes:
        raise HTTPException(403, "writes are off: start terrarium serve with --allow-writes")


def _compaction(dash: Dashboard) -> tuple[Callable[[], Store], ModelAccess]:
    """How a compaction opens its store and reaches the model; 400 if the app was given none."""
    if dash.reopen is None or dash.model is None:
        raise data.BadRequest("compaction needs a model server: this dashboard was given none")
    return dash.reopen, dash.model


def _existing(dash: Dashboard, context: ContextId) -> None:
    """Raise ContextNotFound unless the store has ``context`` (hot or archived)."""
    if dash.call(lambda store: store.get_head(context)) is None:
        raise contexts.not_found(context)


def confirm_page(request: Request) -> HTMLResponse:
    dash = _dash(request)
    _writes(dash)
    action = request.query_params.get("action", "")
    if action not in ACTIONS:
        raise data.BadRequest(f"action must be one of {', '.join(ACTIONS)}")
    if action == "restore":
        trash_id = request.query_params.get("trash", "")
        found = dash.call(data.trash)["trash"]
        entry = next((t for t in found if t["trash_id"] == trash_id), None)
        if entry is None:
            raise NotInTrash(f"nothing in the trash has the id {trash_id[:80]!r}")
        context = entry["context_id"]
    else:
        trash_id, parsed = "", data.parse_context(request.query_params.get("c"))
        if action == "compact":
            _compaction(dash)
        _existing(dash, parsed)
        context = str(parsed)
    return _page(
        request,
        "confirm.html",
        title=f"{action}?",
        action=action,
        context=context,
        trash_id=trash_id,
        lifecycle=isinstance(dash.store, Lifecycle),
    )


async def action(request: Request) -> Response:
    dash = _dash(request)
    _writes(dash)
    form = {k: v[0] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
    if not token_matches(form.get("csrf"), dash.csrf):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    name = form.get("action", "")
    if name == "restore":
        back = await asyncio.to_thread(dash.call, data.restore_trashed, form.get("trash", ""))
        return _shown(back)
    context = data.parse_context(form.get("c"))
    if name == "fork":
        target = ContextId.parse(form.get("target", "")).check_new()
        await asyncio.to_thread(dash.call, contexts.fork_context, context, target)
        return _shown(target)
    if name == "clear":
        await asyncio.to_thread(dash.call, contexts.clear_context, context)
    elif name == "compact":
        reopen, model = _compaction(dash)
        await asyncio.to_thread(_existing, dash, context)
        # Not under dash.call: the model call takes seconds (see terrarium.web.compact).
        await asyncio.to_thread(compact, reopen, model, context)
    elif name == "delete":
        if not await asyncio.to_thread(dash.call, lifecycle.delete_context, context):
            raise contexts.not_found(context)
        return RedirectResponse("/sessions", 303)
    elif name in data.LIFECYCLE_ACTIONS:
        await asyncio.to_thread(dash.call, data.change_state, context, name)
    else:
        raise data.BadRequest(f"action must be one of {', '.join(ACTIONS)}")
    return _shown(context)


def _shown(context: ContextId | str) -> RedirectResponse:
    """After a write: the context's page."""
    return RedirectResponse("/session?" + urlencode({"c": str(context)}), 303)


def pygments_css(request: Request) -> Response:
    return Response(render.pygments_css(), media_type="text/css")


# --------------------------------------------------------------------------- errors


def _error(request: Request, status: int, message: str, hint: str = "") -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message, **({"hint": hint} if hint else {})}, status)
    return _page(
        request, "error.html", status, title=str(status), status=status, message=message, hint=hint
    )


def _plain(
    status: int, what: str = "{exc}", hint: str = "", *, warn: bool = False
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """A handler answering ``status`` with ``what`` (``{exc}``: its str) and ``hint``; ``warn``
    logs it first."""

    async def handle(request: Request, exc: Exception) -> Response:
        if warn:
            log.warning("%s: %s", request.url.path, exc)
        return _error(request, status, what.format(exc=exc), hint)

    return handle


FSCK_HINT = f"{CorruptLog.HINT[0].upper()}{CorruptLog.HINT[1:]}."


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = exc.detail if exc.status_code != 404 else "no such page"
    return _error(request, exc.status_code, message)


async def _broken(request: Request, exc: Exception) -> Response:
    log.exception("error serving %s", request.url.path)
    return _error(request, 500, f"the store could not be read: {type(exc).__name__}")


ERROR_HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    **dict.fromkeys((ContextNotFound, SegmentNotFound, NotInTrash), _plain(404)),
    ValueError: _plain(400),  # InvalidContextId, InvalidQuery, data.BadRequest among them
    **dict.fromkeys((ContextExists, NothingToCompact), _plain(409)),
    # The model server's failure, not ours: 502, its one line (naming the URL), no traceback.
    LLMError: _plain(502, warn=True),
    HTTPException: _http,
    # The log is damaged, not the server: its one line names the file and line, as the CLI's.
    CorruptLog: _plain(500, "damaged session: {exc}", FSCK_HINT, warn=True),
    StoreError: _broken,
    Exception: _broken,
}
"""Each error a handler may raise, and the page or JSON it becomes (the most specific wins)."""


def create_app(
    store: Store,
    *,
    token: str | None = None,
    allow_writes: bool = False,
    location: str = "",
    model: ModelAccess | None = None,
    reopen: Callable[[], Store] | None = None,
) -> Any:
    """The dashboard over ``store`` as an ASGI app.

    Args:
        token: when given, every request must carry it (see :class:`Guard`); when None, only
            requests to a loopback host name are answered.
        allow_writes: serve the fork, clear and delete forms, and on a store with lifecycle
            states archive, unarchive, pin, unpin and restore from the trash (POST,
            CSRF-checked); with ``model`` and ``reopen``, compact too.
        location: the store's location as the user gave it (passwords masked), for the
            page header.
        model: how to reach the model server for a compaction; nothing contacts it before
            one is asked for.
        reopen: opens another instance of ``store`` (same location) for each compaction,
            which closes it after (see :mod:`terrarium.web.compact` for why).

    Raises:
        ValueError: only one of ``model`` and ``reopen`` is given.
    """
    if (model is None) != (reopen is None):
        raise ValueError("create_app: a compaction needs both model and reopen, or neither")
    routes = [
        Route("/", overview_page),
        Route("/sessions", sessions_page),
        Route("/session", session_page),
        Route("/search", search_page),
        Route("/trash", trash_page),
        Route("/confirm", confirm_page),
        Route("/action", action, methods=["POST"]),
        Route("/static/pygments.css", pygments_css),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
        Route("/api/stats", _json(api_stats)),
        Route("/api/contexts", _json(api_contexts)),
        Route("/api/context", _json(api_context)),
        Route("/api/search", _json(api_search)),
        Route("/api/export", api_export),
        Route("/api/trash", _json(api_trash)),
        Route("/api/events", api_events),
        Route("/api/openapi.json", _json(api_openapi)),
    ]
    app = Starlette(routes=routes, exception_handlers=dict(ERROR_HANDLERS))
    app.state.dashboard = Dashboard(store, allow_writes, location, model, reopen)
    return Guard(app, token)
