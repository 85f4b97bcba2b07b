"""The session picker: a prompt_toolkit screen listing sessions, filtered as you type.

Sessions are grouped by type, newest first, with a preview (first user message, last reply)
read only for the rows on screen. The first row starts a new session named by the filter text
(or by the time), or selects the session that text names. Up/Down (Ctrl-P/Ctrl-N) move, Enter
opens, Esc or Ctrl-C cancels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from prompt_toolkit.application import Application
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.layout import HSplit, Layout, Window
from prompt_toolkit.layout.controls import BufferControl, FormattedTextControl
from prompt_toolkit.layout.dimension import Dimension
from prompt_toolkit.layout.processors import BeforeInput
from prompt_toolkit.styles import Style

from terrarium.cli.app import generated_context
from terrarium.cli.output import plural
from terrarium.display import short_time
from terrarium.index._listing import ContextSummary
from terrarium.model import ContextId

_STYLE = Style.from_dict(
    {
        "title": "bold",
        "group": "bold underline",
        "selected": "reverse",
        "dim": "#888888",
        "new": "italic",
        "message": "ansired",
    }
)

_HELP = "type to filter  Up/Down move  Enter open  Esc cancel"

Preview = tuple[str, str]
"""A session's first user message and its last reply (either may be empty)."""

PreviewFn = Callable[[ContextId], Preview | None]
"""Reads a session's preview; None when it cannot be read."""

_FIXED_LINES = 6
"""Screen lines that are not session rows: title, filter, new-session row, "more", status, one
spare (prompt_toolkit keeps the cursor line)."""


def cut(text: str, width: int) -> str:
    """``text`` on one line, at most ``width`` characters (an ellipsis marks a cut)."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return flat[: max(0, width - 1)] + "\u2026"


def preview_line(preview: Preview | None, width: int) -> str:
    """The dim line under a session: ``first user message -> last reply``, within ``width``."""
    if preview is None:
        return "    (preview unavailable)"
    first, last = preview
    if not first and not last:
        return "    (no messages yet)"
    room = max(20, width - 8)  # the indent, the arrow and a spare column
    left = cut(first, room // 2 if last else room)
    if not last:
        return f"    {left}"
    return f"    {left} -> {cut(last, room - len(left))}"


class Picker:
    """The picker's state and its prompt_toolkit application."""

    def __init__(self, rows: list[ContextSummary], default_type: str, preview: PreviewFn) -> None:
        self.rows = rows
        self.default_type = default_type
        self.preview: PreviewFn = functools.cache(preview)
        """A session's preview, read when it is first on screen."""
        self.filter = Buffer(multiline=False, on_text_changed=self._changed)
        self.index = 1 if rows else 0  # 0 is "new session"
        self.top = 0
        """The first visible row on screen (the list scrolls to keep the selection shown)."""
        self.message = ""
        self.app: Application[ContextId | None] = self._application()

    @property
    def visible(self) -> list[ContextSummary]:
        """The rows that match the filter (case-insensitive substring of ``type:name``)."""
        needle = self.filter.text.strip().lower()
        return [r for r in self.rows if needle in r.context.lower()]

    def exact(self) -> ContextSummary | None:
        """The session the filter text names exactly (a bare name: of one type only)."""
        text = self.filter.text.strip()
        if not text:
            return None
        try:
            wanted = str(self._named(text))
        except ValueError:
            wanted = None
        found = next((info for info in self.rows if info.context == wanted), None)
        if found is not None or ":" in text:
            return found
        named = [info for info in self.rows if info.name == text]
        return named[0] if len(named) == 1 else None

    def _changed(self, _buffer: Buffer) -> None:
        self.message = ""
        self.top = 0
        exact = self.exact()
        if exact is not None:
            self.index = self.visible.index(exact) + 1
        else:
            self.index = 1 if self.visible else 0

    def _named(self, text: str) -> ContextId:
        """The session ``text`` names (a bare name: of the default type); else ValueError."""
        return ContextId.parse(text) if ":" in text else ContextId(self.default_type, text)

    def _move(self, step: int) -> None:
        self.index = max(0, min(len(self.visible), self.index + step))

    def choose(self) -> ContextId | None:
        """What Enter on the current row opens; None (with a message) when nothing yet."""
        if self.index > 0:
            return self.visible[self.index - 1].id
        exact = self.exact()
        if exact is not None:
            return exact.id
        text = self.filter.text.strip()
        if not text:
            return generated_context(self.default_type)
        try:
            return self._named(text)
        except ValueError as exc:
            self.message = str(exc)
            return None

    def _new_label(self) -> str:
        text = self.filter.text.strip()
        if not text:
            return "+ new session (type its name, or Enter for a new one named by the time)"
        exact = self.exact()
        if exact is not None:
            return f"+ new session ({exact.context} exists: Enter opens it)"
        name = text if ":" in text else f"{self.default_type}:{text}"
        return f"+ new session {name}"

    def _size(self) -> tuple[int, int]:
        """The terminal's (rows, columns)."""
        try:
            size = self.app.output.get_size()
        except AttributeError:  # before the application exists
            return 24, 80
        return size.rows, size.columns

    def _lines(self, visible: list[ContextSummary], start: int, stop: int) -> int:
        """Screen lines that rows ``start..stop`` of ``visible`` take (with group headings)."""
        lines, group = 0, None
        for info in visible[start:stop]:
            if info.type != group:
                group = info.type
                lines += 1
            lines += 2  # the row and its preview
        return lines

    def _window(self, visible: list[ContextSummary]) -> tuple[int, int]:
        """The rows of ``visible`` on screen, ``start..stop``, the selected one among them."""
        budget = max(3, self._size()[0] - _FIXED_LINES)
        selected = self.index - 1
        if selected >= 0:
            self.top = min(self.top, selected)
            while self.top < selected and self._lines(visible, self.top, selected + 1) > budget:
                self.top += 1
        self.top = min(self.top, max(0, len(visible) - 1))
        stop = self.top
        while stop < len(visible) and self._lines(visible, self.top, stop + 1) <= budget:
            stop += 1
        return self.top, max(stop, min(self.top + 1, len(visible)))

    def render(self) -> StyleAndTextTuples:
        """The rows on screen as formatted text, the selected row marked."""
        out: StyleAndTextTuples = []

        def row(index: int, text: str, style: str = "") -> None:
            selected = index == self.index
            if selected:
                out.append(("[SetCursorPosition]", ""))
            out.append(
                ("class:selected" if selected else style, ("> " if selected else "  ") + text)
            )
            out.append(("", "\n"))

        row(0, self._new_label(), "class:new")
        visible = self.visible
        start, stop = self._window(visible)
        columns = self._size()[1]
        width = min(max([10, *(len(r.name) for r in visible[start:stop])]), 40)
        group = None
        for number, info in enumerate(visible[start:stop], start=start + 1):
            if info.type != group:
                group = info.type
                out.append(("class:group", group))
                out.append(("", "\n"))
            legacy = "  (legacy)" if info.legacy_path else ""
            row(
                number,
                f"{info.name:<{width}}  {plural(info.message_count, 'message'):>14}  "
                f"{short_time(info.last_active)}{legacy}",
            )
            out.append(("class:dim", preview_line(self.preview(info.id), columns)))
            out.append(("", "\n"))
        if stop < len(visible) or start > 0:
            out.append(("class:dim", f"  ({len(visible) - stop} more below, {start} above)"))
            out.append(("", "\n"))
        if not visible and self.rows:
            out.append(("class:dim", "  no session matches the filter\n"))
        if out and out[-1] == ("", "\n"):
            out.pop()
        return out

    def _status(self) -> StyleAndTextTuples:
        if self.message:
            return [("class:message", self.message)]
        return [("class:dim", _HELP)]

    def _list_height(self) -> Dimension:
        rows = self._size()[0]
        visible = self.visible
        lines = self._lines(visible, 0, len(visible)) + 2  # the new-session and "more" rows
        return Dimension(min=1, max=max(3, rows - 3), preferred=lines)

    def _application(self) -> Application[ContextId | None]:
        keys = KeyBindings()
        moves = {"up": -1, "c-p": -1, "down": 1, "c-n": 1, "pageup": -10, "pagedown": 10}
        for key, step in moves.items():
            keys.add(key)(lambda _event, step=step: self._move(step))

        @keys.add("enter")
        def _enter(event: KeyPressEvent) -> None:
            chosen = self.choose()
            if chosen is not None:
                event.app.exit(result=chosen)

        @keys.add("escape", eager=True)
        @keys.add("c-c")
        @keys.add("c-d")
        def _cancel(event: KeyPressEvent) -> None:
            event.app.exit(result=None)

        body = HSplit(
            [
                Window(
                    FormattedTextControl([("class:title", "Pick a session, or start a new one")]),
                    height=1,
                ),
                Window(
                    BufferControl(self.filter, input_processors=[BeforeInput("filter: ")]), height=1
                ),
                Window(
                    FormattedTextControl(self.render, focusable=False, show_cursor=False),
                    height=self._list_height,
                    always_hide_cursor=True,
                ),
                Window(FormattedTextControl(self._status), height=1),
            ]
        )
        return Application(
            layout=Layout(body, focused_element=self.filter),
            key_bindings=keys,
            style=_STYLE,
            full_screen=False,
            erase_when_done=True,
            mouse_support=False,
        )

    async def run(self) -> ContextId | None:
        """Run the picker; the chosen (or new) context, or None when cancelled."""
        return await self.app.run_async(handle_sigint=False)
