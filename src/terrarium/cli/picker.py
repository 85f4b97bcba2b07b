"""The session picker: a prompt_toolkit screen listing sessions, filtered as you type.

Sessions are grouped by type, newest first, each with its message count and when it was last
active. The first row starts a new session named by the filter text (``main`` or
``irc:#python``). Up/Down (or Ctrl-P/Ctrl-N) move, Enter opens, Esc or Ctrl-C cancels.
"""

from __future__ import annotations

from prompt_toolkit.application import Application
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.layout import HSplit, Layout, Window
from prompt_toolkit.layout.controls import BufferControl, FormattedTextControl
from prompt_toolkit.layout.dimension import Dimension
from prompt_toolkit.layout.processors import BeforeInput
from prompt_toolkit.styles import Style

from terrarium.cli.catalog import SessionInfo
from terrarium.cli.output import short_time
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


class Picker:
    """The picker's state and its prompt_toolkit application."""

    def __init__(self, rows: list[SessionInfo], default_type: str = "cli") -> None:
        self.rows = rows
        self.default_type = default_type
        self.filter = Buffer(multiline=False, on_text_changed=self._changed)
        self.index = 1 if rows else 0  # 0 is "new session"
        self.message = ""
        self.app: Application[ContextId | None] = self._application()

    # ------------------------------------------------------------------ state

    @property
    def visible(self) -> list[SessionInfo]:
        """The rows that match the filter (case-insensitive substring of ``type:name``)."""
        needle = self.filter.text.strip().lower()
        return [r for r in self.rows if needle in str(r.context).lower()]

    def _changed(self, _buffer: Buffer) -> None:
        self.message = ""
        self.index = 1 if self.visible else 0

    def _move(self, step: int) -> None:
        count = len(self.visible) + 1
        self.index = max(0, min(count - 1, self.index + step))

    def choose(self) -> ContextId | None:
        """What Enter on the current row opens; None (with a message) when nothing yet."""
        if self.index > 0:
            return self.visible[self.index - 1].context
        text = self.filter.text.strip()
        if not text:
            self.message = "type the new session's name first (name or type:name)"
            return None
        try:
            if ":" in text:
                return ContextId.parse(text)
            return ContextId(self.default_type, text)
        except ValueError as exc:
            self.message = str(exc)
            return None

    # ------------------------------------------------------------------ rendering

    def _new_label(self) -> str:
        text = self.filter.text.strip()
        if not text:
            return "+ new session (type its name)"
        name = text if ":" in text else f"{self.default_type}:{text}"
        return f"+ new session {name}"

    def render(self) -> StyleAndTextTuples:
        """The list as formatted text, the selected row marked."""
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
        width = max((len(r.context.name) for r in visible), default=10)
        width = min(max(width, 10), 40)
        group = None
        for number, info in enumerate(visible, start=1):
            if info.context.type != group:
                group = info.context.type
                out.append(("class:group", group))
                out.append(("", "\n"))
            legacy = "  (legacy)" if info.legacy_path else ""
            row(
                number,
                f"{info.context.name:<{width}}  {info.message_count:>5} messages  "
                f"{short_time(info.last_active)}{legacy}",
            )
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
        rows = self.app.output.get_size().rows if hasattr(self, "app") else 24
        lines = len(self.visible) + len({r.context.type for r in self.visible}) + 1
        return Dimension(min=1, max=max(3, rows - 4), preferred=lines)

    def _application(self) -> Application[ContextId | None]:
        keys = KeyBindings()

        @keys.add("up")
        @keys.add("c-p")
        def _up(event: KeyPressEvent) -> None:
            self._move(-1)

        @keys.add("down")
        @keys.add("c-n")
        def _down(event: KeyPressEvent) -> None:
            self._move(1)

        @keys.add("pageup")
        def _page_up(event: KeyPressEvent) -> None:
            self._move(-10)

        @keys.add("pagedown")
        def _page_down(event: KeyPressEvent) -> None:
            self._move(10)

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
                    BufferControl(self.filter, input_processors=[BeforeInput("filter: ")]),
                    height=1,
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


async def pick_session(rows: list[SessionInfo], default_type: str = "cli") -> ContextId | None:
    """Run the picker; the chosen (or new) context, or None when cancelled."""
    picker = Picker(rows, default_type)
    return await picker.app.run_async(handle_sigint=False)
