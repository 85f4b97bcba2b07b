"""The log model: ids, context ids, history items, log entries and restored state. No I/O.

History items are kept as given (:data:`LoggedItem`, a Chat message or a Responses API item),
plain dicts on the hot path so that keys written by a newer terrarium survive; :class:`Item`
is the typed view of a Chat message. docs/format.md describes the lines.
"""

from __future__ import annotations

import datetime
import re
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Literal, TypeAlias, cast
from urllib.parse import unquote

import msgspec

from terrarium.errors import InvalidContextId, InvalidEntry

#: Major version of the log format this code reads and writes. A newer major is refused.
FORMAT_VERSION = 1

SessionId: TypeAlias = uuid.UUID
"""Session identifier: the fork-tree root. UUIDv7, time-ordered."""

SegmentId: TypeAlias = uuid.UUID
"""Segment identifier: one branch of the tree. UUIDv7, time-ordered and sortable."""


def new_session_id() -> SessionId:
    """Return a new, time-ordered session id."""
    # uuid6 reads its package metadata when imported (~0.1 s through importlib.metadata), so it
    # is imported by the first id minted, not by every command that only reads (list, show).
    from uuid6 import uuid7

    return uuid7()


def new_segment_id() -> SegmentId:
    """Return a new, time-ordered segment id."""
    return new_session_id()


_second: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """Return the current UTC time as an RFC 3339 string with microseconds and ``Z``."""
    # Formatting a datetime costs ~2 µs, a fifth of an append; the second changes rarely.
    global _second
    second, micros = divmod(time.time_ns() // 1000, 1_000_000)
    cached, prefix = _second
    if second != cached:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second = (second, prefix)
    return f"{prefix}.{micros:06d}Z"


def parse_timestamp(text: str) -> datetime.datetime:
    """Parse an ISO 8601 timestamp as an aware UTC datetime (a naive one is taken as UTC)."""
    when = datetime.datetime.fromisoformat(text)
    if when.tzinfo is None:
        return when.replace(tzinfo=datetime.UTC)
    return when.astimezone(datetime.UTC)


TYPE_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
"""A context type: a lowercase slug, at most 32 characters (``cli``, ``irc``)."""
DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
"""A date folder's name, ``YYYY-MM-DD``: the ``{date}`` of ``{type}/{date}/{name}``."""
#: Longest encoded context name, in bytes: the usual file-name limit.
MAX_NAME_BYTES = 255
# Characters that are unsafe in a file name on Linux, macOS or Windows, plus the escape itself.
_UNSAFE = frozenset('<>:"/\\|?*%')
_WINDOWS_RESERVED = frozenset(
    ["CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"]
    + [f"{port}{n}" for port in ("COM", "LPT") for n in "123456789\u00b9\u00b2\u00b3"]
)


def encode_name(name: str) -> str:
    """Return ``name`` as a file name that is safe on Linux, macOS and Windows (one to one).

    Unsafe characters become ``%XX`` escapes of their UTF-8 bytes, as do a leading or trailing
    dot or space and the first character of a Windows device name.
    """
    # A printable name holds no control character: only the unsafe ones need a look (ten
    # times faster; the filesystem store encodes a name several times per append).
    if name.isprintable() and _UNSAFE.isdisjoint(name):
        text = name
    else:
        text = "".join(
            "".join(f"%{b:02X}" for b in ch.encode())
            if ch in _UNSAFE or unicodedata.category(ch) == "Cc"
            else ch
            for ch in name
        )
    if text[:1] in (".", " "):
        text = f"%{ord(text[0]):02X}{text[1:]}"
    if text[-1:] in (".", " "):
        text = f"{text[:-1]}%{ord(text[-1]):02X}"
    if text.split(".", 1)[0].upper() in _WINDOWS_RESERVED:
        text = f"%{ord(text[0]):02X}{text[1:]}"
    return text


def legacy_file_names(name: str) -> list[str]:
    """A legacy JSON file's possible names for ``name``: as the old tool wrote it, then encoded.

    A name too long for a file is left out (looking for it fails with "File name too long").
    """
    names = [f"{stem}.json" for stem in dict.fromkeys((name, encode_name(name)))]
    return [n for n in names if len(n.encode()) <= MAX_NAME_BYTES]


def decode_name(encoded: str) -> str:
    """Invert :func:`encode_name`."""
    return unquote(encoded, errors="strict")


def context_file(context: ContextId | str, extension: str, date: str | None = None) -> str:
    """``{type}/[{date}/]{encoded name}{extension}``: a file about a context, relative.

    A name too long for a file keeps a prefix, then ``~`` and a digest of the whole.
    """
    ctx = ContextId.parse(context)
    folder = f"{ctx.type}/{date}" if date is not None else ctx.type
    stem = encode_name(ctx.name)
    name = f"{stem}{extension}"
    if len(name.encode()) > MAX_NAME_BYTES:
        import hashlib  # loads OpenSSL: not at import, which `terrarium list` waits for

        digest = hashlib.sha256(stem.encode()).hexdigest()[:12]
        room = MAX_NAME_BYTES - len(f"~{digest}{extension}".encode())
        prefix = stem.encode()[:room].decode(errors="ignore")  # whole characters only
        name = f"{prefix}~{digest}{extension}"
    return f"{folder}/{name}"


# Zero-width non-joiner and joiner: emoji sequences (👩‍💻) and Persian and Indic spellings
# need them, between two non-ASCII characters; anywhere else they only hide.
_JOINERS = frozenset("\u200c\u200d")


def misleading_chars(name: str) -> list[int]:
    """The indexes of the characters that make ``name`` display as something it is not.

    Control characters, line and paragraph separators, and invisible format characters
    (``Cf``); U+200C and U+200D only next to an ASCII character or at either end.
    """
    if name.isascii() and name.isprintable():  # the common case: a listing of 10k names meets
        return []
    last = len(name) - 1
    return [
        i
        for i, ch in enumerate(name)
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")  # the joiners are Cf
        and not (ch in _JOINERS and 0 < i < last and min(ord(name[i - 1]), ord(name[i + 1])) > 127)
    ]


def display_name(name: str) -> str:
    """``name`` for a terminal: characters that would mislead shown as ``\\uXXXX`` escapes."""
    found = misleading_chars(name)
    if not found:
        return name
    chars = list(name)
    for i in found:
        code = ord(chars[i])
        chars[i] = f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return "".join(chars)


def printable(text: str) -> str:
    """``text`` (a path, a name) for a one-line message: unprintable characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ContextId(msgspec.Struct, frozen=True, order=True):
    """A context identifier ``type:name`` such as ``irc:#python``."""

    type: str
    """Endpoint type: any lowercase slug (``cli``, ``irc``, ``game``, ``web``, ...)."""
    name: str
    """The context's name within its type (``main``, ``#python``): the seed's ``session_id``."""

    def __post_init__(self) -> None:
        if not TYPE_RE.fullmatch(self.type):
            raise InvalidContextId(
                f"invalid context type {self.type!r}: use a lowercase slug such as 'cli' or 'irc'"
            )
        if self.type.upper() in _WINDOWS_RESERVED:
            raise InvalidContextId(
                f"invalid context type {self.type!r}: it is a reserved device name on Windows"
            )
        name = self.name
        if not name:
            raise InvalidContextId(f"invalid context id {self.type}:: the name is empty")
        if name in (".", ".."):
            raise InvalidContextId(f"invalid context name {name!r}: '.' and '..' are not names")
        if "/" in name:
            raise InvalidContextId(f"invalid context name {name!r}: it contains '/'")
        if any(unicodedata.category(c) == "Cc" for c in name):
            raise InvalidContextId(
                f"invalid context name {name!r}: it contains a control character"
            )
        try:
            encoded = encode_name(name).encode()
        except UnicodeEncodeError:
            raise InvalidContextId(
                f"invalid context name {name!r}: it is not valid Unicode (a lone surrogate)"
            ) from None
        if len(encoded) > MAX_NAME_BYTES:
            raise InvalidContextId(
                f"invalid context name {name[:20]!r}...: longer than {MAX_NAME_BYTES} bytes encoded"
            )

    def check_new(self) -> ContextId:
        """This id, if a *new* context may take its name (no :func:`misleading_chars`).

        Raises InvalidContextId if not, or if the name is only spaces (``cli: `` lists as
        ``cli:``). Existing contexts keep their names, shown escaped.
        """
        if self.name.isspace():
            raise InvalidContextId(
                f"invalid context name {self.name!r}: it is only spaces, which show as nothing"
            )
        found = misleading_chars(self.name)
        if found:
            ch = self.name[found[0]]
            described = unicodedata.name(ch, "a format character")
            raise InvalidContextId(
                f"invalid context name '{display_name(self.name)}': it contains "
                f"U+{ord(ch):04X} ({described}), which makes names display misleadingly"
            )
        return self

    @property
    def display(self) -> str:
        """The id for a terminal, misleading characters escaped (see :func:`display_name`)."""
        return f"{self.type}:{display_name(self.name)}"

    @classmethod
    def parse(cls, text: str | ContextId) -> ContextId:
        """Parse ``type:name``; raise :class:`InvalidContextId` naming the problem."""
        if isinstance(text, ContextId):
            return text
        if not isinstance(text, str):
            raise InvalidContextId(f"a context id must be a string, not {type(text).__name__}")
        if not text:
            raise InvalidContextId("invalid context id '': it is empty")
        if ":" not in text:
            raise InvalidContextId(
                f"invalid context id {text!r}: expected 'type:name', such as 'cli:main'"
            )
        type_, name = text.split(":", 1)
        return cls(type_, name)

    @property
    def encoded_name(self) -> str:
        """The name as a safe file name (see :func:`encode_name`)."""
        return encode_name(self.name)

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


LoggedRole: TypeAlias = Literal["system", "user", "assistant", "tool"]
"""The roles a logged item may have."""

LoggedContentPart: TypeAlias = dict[str, Any]
"""One content part on disk: ``{"type": "text", "text": ...}``, ``{"type": "image_url", ...}``."""

LoggedItem: TypeAlias = dict[str, Any]
"""A history item on disk: a Chat Completions message, or a Responses API item, as given."""

ROLES: frozenset[str] = frozenset(("system", "user", "assistant", "tool"))
# A message without a ``type`` may also be the Responses API's easy input message for the
# developer (``{"role": "developer", "content": ...}``), which Chat has no role for.
_MESSAGE_ROLES = ROLES | {"developer"}


class Role(StrEnum):
    """The role of a history item."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class TextPart(msgspec.Struct, frozen=True):
    """Plain text."""

    text: str


class ImagePart(msgspec.Struct, frozen=True):
    """A reference to an image (URL or ``data:`` URI); the bytes are not in the log."""

    url: str
    detail: str | None = None


class ToolCallPart(msgspec.Struct, frozen=True):
    """A tool call made by the assistant."""

    id: str
    name: str
    arguments: str
    """The arguments as the model produced them (a JSON string)."""
    extra: Mapping[str, Any] = msgspec.field(default_factory=dict)
    """Keys of the call this version does not model (``function_extra``: of its function)."""


class ReasoningPart(msgspec.Struct, frozen=True):
    """The model's reasoning text (``reasoning_content`` on vLLM)."""

    text: str


class UnknownPart(msgspec.Struct, frozen=True):
    """A content part of a type this version does not know, kept verbatim."""

    data: Mapping[str, Any]


ContentPart: TypeAlias = TextPart | ImagePart | ToolCallPart | ReasoningPart | UnknownPart
"""One piece of an item's content."""


class Item(msgspec.Struct, frozen=True):
    """A history item: a message of some role whose content is text or parts."""

    role: Role
    content: str | tuple[ContentPart, ...]
    name: str | None = None
    """Optional participant name (an IRC nick, say)."""
    tool_call_id: str | None = None
    """For a tool result: the id of the call it answers."""
    extra: Mapping[str, Any] = msgspec.field(default_factory=dict)
    """Keys this version does not model, carried through untouched."""

    @classmethod
    def user(cls, text: str) -> Item:
        """A user message."""
        return cls(Role.USER, text)

    @classmethod
    def assistant(cls, text: str) -> Item:
        """An assistant message."""
        return cls(Role.ASSISTANT, text)

    @classmethod
    def system(cls, text: str) -> Item:
        """A system message."""
        return cls(Role.SYSTEM, text)

    @property
    def text(self) -> str:
        """The item's text, as :func:`item_text` reads its logged form (the one text rule)."""
        return item_text(to_logged(self))


def to_logged(item: Item) -> LoggedItem:
    """Convert an :class:`Item` to its stable on-disk form (an OpenAI message dict)."""
    out: LoggedItem = dict(item.extra)
    out["role"] = str(item.role)
    if isinstance(item.content, str):
        out["content"] = item.content
    else:
        parts: list[LoggedContentPart] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for part in item.content:
            if isinstance(part, TextPart):
                parts.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart):
                image: dict[str, Any] = {"url": part.url}
                if part.detail is not None:
                    image["detail"] = part.detail
                parts.append({"type": "image_url", "image_url": image})
            elif isinstance(part, ToolCallPart):
                extra = dict(part.extra)
                function = {"name": part.name, "arguments": part.arguments}
                function.update(extra.pop("function_extra", None) or {})
                calls.append({"id": part.id, "type": "function", "function": function, **extra})
            elif isinstance(part, ReasoningPart):
                reasoning.append(part.text)
            else:
                parts.append(dict(part.data))
        if len(parts) == 1 and parts[0].get("type") == "text" and not calls:
            out["content"] = parts[0]["text"]
        else:
            out["content"] = parts if parts or not calls else None
        if calls:
            out["tool_calls"] = calls
        if reasoning:
            out["reasoning_content"] = "".join(reasoning)
    if item.name is not None:
        out["name"] = item.name
    if item.tool_call_id is not None:
        out["tool_call_id"] = item.tool_call_id
    return out


_ITEM_KEYS = frozenset(
    ("role", "content", "name", "tool_call_id", "tool_calls", "reasoning_content")
)


def from_logged(logged: Mapping[str, Any]) -> Item:
    """Convert an on-disk item back to an :class:`Item`; unknown keys land in ``extra``.

    Raises:
        InvalidEntry: ``logged`` is not a valid item, or is a Responses API item (use the dict).
    """
    check_item(logged)
    if is_responses_item(logged):
        raise InvalidEntry(
            f"a Responses API item ({short_repr(logged['type'])}) has no Item form: use the dict"
        )
    content = logged.get("content")
    parts: list[ContentPart] = []
    reasoning = logged.get("reasoning_content")
    if reasoning:
        parts.append(ReasoningPart(reasoning))
    if isinstance(content, list):
        for raw in content:
            kind = raw.get("type")
            # A part with keys this version does not model is kept whole, as UnknownPart.
            if kind == "text" and raw.keys() == {"type", "text"}:
                parts.append(TextPart(raw["text"]))
            elif (
                kind == "image_url"
                and raw.keys() == {"type", "image_url"}
                and isinstance(raw["image_url"], Mapping)
                and raw["image_url"].keys() <= {"url", "detail"}
            ):
                image = raw["image_url"]
                parts.append(ImagePart(image.get("url", ""), image.get("detail")))
            else:
                parts.append(UnknownPart(dict(raw)))
    elif isinstance(content, str) and (parts or logged.get("tool_calls")):
        parts.append(TextPart(content))
    for call in logged.get("tool_calls") or ():
        fn = call.get("function") or {}
        extra = {k: v for k, v in call.items() if k not in ("id", "type", "function")}
        fn_extra = {k: v for k, v in fn.items() if k not in ("name", "arguments")}
        if fn_extra:
            extra["function_extra"] = fn_extra
        parts.append(
            ToolCallPart(call.get("id", ""), fn.get("name", ""), fn.get("arguments", ""), extra)
        )
    return Item(
        role=Role(logged["role"]),
        content=tuple(parts) if parts or not isinstance(content, str) else content,
        name=logged.get("name"),
        tool_call_id=logged.get("tool_call_id"),
        extra={k: v for k, v in logged.items() if k not in _ITEM_KEYS},
    )


def check_item(item: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidEntry` unless ``item`` is a well-formed logged item.

    A Responses item needs only a non-empty string ``type``, so kinds not known yet are kept.
    """
    if not isinstance(item, Mapping):
        raise InvalidEntry(f"a history item must be a dict, not {type(item).__name__}")
    if "type" in item:
        kind = item["type"]
        if not isinstance(kind, str) or not kind:
            raise InvalidEntry(
                f"history item has invalid type {short_repr(kind)}: a Responses API item's "
                "'type' is a non-empty string such as 'message' or 'function_call'"
            )
        if "role" in item and not isinstance(item["role"], str):
            raise InvalidEntry(f"{kind} history item has invalid role {short_repr(item['role'])}")
        return
    role = item.get("role")
    if not isinstance(role, str) or role not in _MESSAGE_ROLES:
        raise InvalidEntry(
            f"history item has invalid role {short_repr(role)}: expected one of "
            f"{sorted(_MESSAGE_ROLES)}, or a 'type' (a Responses API item)"
        )
    content = item.get("content")
    if content is None:
        if role == "assistant" and item.get("tool_calls"):
            return
        raise InvalidEntry(f"{role} history item has no content")
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not all(
        isinstance(p, Mapping) and isinstance(p.get("type"), str) for p in content
    ):
        raise InvalidEntry(f"{role} history item content must be a string or a list of typed parts")


def short_repr(value: Any, show: Callable[[Any], str] = repr) -> str:
    """``repr(value)`` (or ``show(value)``) cut to one short line, for an error message."""
    text = show(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_text(text: str, what: str) -> str:
    """Return ``text``, or raise :class:`InvalidEntry` if it holds a lone surrogate."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise InvalidEntry(f"{what} {not_unicode(exc)}") from None
    return text


def not_unicode(exc: UnicodeEncodeError) -> str:
    """Why UTF-8 could not encode a text: ``is not valid Unicode: lone surrogate U+D800 ...``."""
    char = exc.object[exc.start : exc.start + 1]
    return f"is not valid Unicode: lone surrogate U+{ord(char):04X} at character {exc.start}"


def as_logged(item: Item | Mapping[str, Any]) -> LoggedItem:
    """Accept an :class:`Item` or a logged dict and return a validated logged dict."""
    if isinstance(item, Item):
        return to_logged(item)
    check_item(item)
    return dict(item)


#: Part types whose ``text`` is text: Chat's ``text``, a Responses message's ``input_text`` and
#: ``output_text``, a reasoning item's ``summary_text`` and ``reasoning_text``.
TEXT_PART_TYPES: frozenset[str] = frozenset(
    ("text", "input_text", "output_text", "summary_text", "reasoning_text")
)
# Part types that only the Responses API uses: a content list holding one is converted for Chat.
_RESPONSES_PARTS = frozenset(
    ("input_text", "output_text", "refusal", "input_image", "summary_text", "reasoning_text")
)


def is_responses_item(item: Mapping[str, Any]) -> bool:
    """Whether a logged item is a Responses API item: it has a ``type``, or is a developer one."""
    return "type" in item or item.get("role") == "developer"


def chat_view(item: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Chat Completions message a logged item stands for, or None when it has none.

    A Responses ``message`` keeps its role (``developer`` made ``system``), a ``function_call``
    is an assistant tool call, a ``function_call_output`` a ``tool`` message, a ``reasoning``
    item an assistant message with only ``reasoning_content``. Other kinds have no view.
    """
    if not is_responses_item(item):
        return item
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        role = "system" if role == "developer" else role
        if not isinstance(role, str) or role not in ROLES:
            return None
        return {"role": role, "content": _chat_parts(item.get("content"))}
    if kind == "function_call":
        call = {
            "id": str(item.get("call_id") or item.get("id") or ""),
            "type": "function",
            "function": {
                "name": str(item.get("name") or ""),
                "arguments": str(item.get("arguments") or ""),
            },
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        return {
            "role": "tool",
            "tool_call_id": str(item.get("call_id") or ""),
            "content": _parts_text(item.get("output")),
        }
    if kind == "reasoning":
        return {"role": "assistant", "content": None, "reasoning_content": item_text(item)}
    return None


def _chat_parts(content: Any) -> Any:
    """Responses parts made Chat parts (all text: one string); parts not objects are left out."""
    if not isinstance(content, list):
        return content
    parts: list[Any] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        kind, text = part.get("type"), _part_text(part)
        if text is not None:
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image = {"url": part["image_url"]}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            parts.append(dict(part))
    if all(p.get("type") == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def item_role(item: Mapping[str, Any]) -> str | None:
    """The Chat role a logged item plays (:func:`chat_view`), or None (an item with no view)."""
    view = chat_view(item)
    role = view.get("role") if view is not None else None
    return role if isinstance(role, str) and role in ROLES else None


def item_label(item: Mapping[str, Any]) -> str:
    """What display calls an item: its role, else its Responses ``type``."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        return role if isinstance(role, str) else "?"
    return str(kind)


def _parts_text(parts: Any, sep: str | None = None) -> str:
    """Text parts and refusals joined by ``sep``; by default Responses parts a line apart."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return ""
    parts = [part for part in parts if isinstance(part, Mapping)]
    if sep is None:
        sep = "\n" if any(part.get("type") in _RESPONSES_PARTS for part in parts) else ""
    return sep.join(text for part in parts if (text := _part_text(part)) is not None)


def _part_text(part: Mapping[str, Any]) -> str | None:
    """The text of a text part or a refusal; None for any other part."""
    kind = part.get("type")
    text = part.get("refusal") if kind == "refusal" else part.get("text")
    if (kind in TEXT_PART_TYPES or kind == "refusal") and isinstance(text, str):
        return text
    return None


def item_text(item: Mapping[str, Any]) -> str:
    """The plain text of a logged item, for display, search, export and compaction.

    Tool calls and unknown kinds have none; a ``reasoning`` item's is its summary, then its text.
    """
    kind = item.get("type", "message")
    if kind == "message":
        return _parts_text(item.get("content"))
    if kind == "function_call_output":
        return _parts_text(item.get("output"))
    if kind == "reasoning":
        texts = (_parts_text(item.get(key), "\n\n") for key in ("summary", "content"))
        return "\n\n".join(text for text in texts if text)
    return ""


#: Keys of a history item that are sent to the model server; others stay in the log only.
WIRE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


def wire_message(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """The message sent to the server for a logged item (standard OpenAI keys), or None.

    Reasoning, kinds with no view and empty messages are not sent; a tool result always is,
    even empty (its call needs an answer).
    """
    if "type" in item or item.get("role") == "developer":  # is_responses_item, inlined
        view = chat_view(item)  # whose content is Chat content already
        if view is None or not (
            view.get("content") or view.get("tool_calls") or view.get("role") == "tool"
        ):
            return None
        return {k: view[k] for k in WIRE_KEYS if k in view}
    message = {k: item[k] for k in WIRE_KEYS if k in item}
    content = message.get("content")
    # Chat content is sent as it is; a list holding a Responses part is made Chat parts.
    if isinstance(content, list) and any(
        isinstance(p, Mapping) and p.get("type") in _RESPONSES_PARTS for p in content
    ):
        message["content"] = _chat_parts(content)
    return message


def wire_messages(
    system_prompt: str | None, history: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The messages sent to the server: the system prompt, then the history item by item."""
    messages: list[dict[str, Any]] = (
        [{"role": "system", "content": system_prompt}] if system_prompt else []
    )
    for item in history:
        add_wire_message(messages, item)
    return messages


def add_wire_message(messages: list[dict[str, Any]], item: Mapping[str, Any]) -> None:
    """Append ``item``'s wire message to ``messages``; a user message after a user message folds.

    A failed turn leaves its input with no reply, and strict chat templates (Llama 2, Mistral,
    Gemma) refuse two user messages in a row. They are sent as one, a repeated text (a retry)
    once; the log keeps each. The last message is replaced, never changed in place (an earlier
    request may hold it). A ``function_call`` after an assistant message joins it.
    """
    message = wire_message(item)
    if message is None:
        return
    if messages:
        role, last = message.get("role"), messages[-1]
        if role == "user":
            if last.get("role") == "user":
                messages[-1] = _fold_user(last, message)
                return
        elif role == "assistant" and item.get("type") == "function_call":
            if last.get("role") == "assistant":
                calls = [*(last.get("tool_calls") or ()), *message["tool_calls"]]
                messages[-1] = {**last, "tool_calls": calls}
                return
    messages.append(message)


def _fold_user(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """Two consecutive user messages as one; a ``name`` survives only if both carry it."""
    a, b = first.get("content") or "", second.get("content") or ""
    content: str | list[Any]
    if isinstance(a, str) and isinstance(b, str):
        if not a or not b or a == b or a.endswith("\n\n" + b):
            content = a or b  # an input sent again after its failure goes once
        else:
            content = f"{a}\n\n{b}"
    else:
        content = _parts(a) + _parts(b)
    folded: dict[str, Any] = {"role": "user", "content": content}
    if "name" in first and first.get("name") == second.get("name"):
        folded["name"] = first["name"]
    return folded


def _parts(content: str | list[Any]) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content}] if content else []


class UsageRecord(msgspec.Struct, frozen=True):
    """Token usage of one model call."""

    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens served from the server's prefix cache, when it reports them."""
    estimated: str | None = None
    """How the counts were estimated (``tokenizer``, ``chars``); None: the server's."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (``estimated`` only when set)."""
        data = msgspec.structs.asdict(self)
        if self.estimated is None:
            del data["estimated"]
        return data


class UsageTotals(msgspec.Struct, frozen=True):
    """Usage summed over a segment's lineage; the ``estimated_`` fields are the estimated part."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    calls: int = 0
    estimated_prompt_tokens: int = 0
    """The part of ``prompt_tokens`` that was estimated."""
    estimated_completion_tokens: int = 0
    """The part of ``completion_tokens`` that was estimated."""
    estimated_calls: int = 0
    """Calls whose usage was estimated (the server reported none)."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def is_estimated(self) -> bool:
        """True when any of the counts is (partly) an estimate."""
        return self.estimated_calls > 0

    def describe(self) -> str:
        """``120 prompt, 30 completion in 3 calls``, estimates marked ``~`` and counted."""
        mark = "~" if self.is_estimated else ""
        text = f"{mark}{self.prompt_tokens} prompt, {mark}{self.completion_tokens} completion in "
        text += f"{self.calls} call{'' if self.calls == 1 else 's'}"
        return f"{text} ({self.estimated_calls} estimated)" if self.estimated_calls else text

    def add(self, entry: Mapping[str, Any]) -> UsageTotals:
        """These totals plus one ``usage`` entry (or its data)."""
        prompt = entry.get("prompt_tokens", 0)
        completion = entry.get("completion_tokens", 0)
        estimated = entry.get("estimated") is not None
        return UsageTotals(
            self.prompt_tokens + prompt,
            self.completion_tokens + completion,
            self.cached_tokens + entry.get("cached_tokens", 0),
            self.calls + 1,
            self.estimated_prompt_tokens + (prompt if estimated else 0),
            self.estimated_completion_tokens + (completion if estimated else 0),
            self.estimated_calls + int(estimated),
        )

    def to_dict(self) -> dict[str, int]:
        """The totals as a header carries them (``estimated_*`` keys only when non-zero)."""
        data = msgspec.structs.asdict(self)
        return {k: v for k, v in data.items() if self.estimated_calls or "estimated" not in k}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UsageTotals:
        """Totals a header carries (missing keys are 0)."""
        return cls(*(int(data.get(f, 0) or 0) for f in cls.__struct_fields__))


class SystemItem(msgspec.Struct, frozen=True):
    """A runtime event (a pod event in the crate) that is rendered into history as a message."""

    event: str
    """What happened: ``config_changed``, ``context_switched``, ``tool_denied``, ..."""
    detail: Mapping[str, Any] = msgspec.field(default_factory=dict)
    """Event data, kept in the log next to the rendering."""


def render_pod_event(item: SystemItem) -> str:
    """Render a runtime event as the text the model sees, e.g. ``[event: resumed] after=3h``."""
    details = " ".join(f"{k}={v}" for k, v in sorted(item.detail.items()))
    return f"[event: {item.event}]" + (f" {details}" if details else "")


POD_SCOPE_EXTENSION_DOMAIN = "terrarium.pod_scope"
"""The extension domain under which :class:`PodScopeSnapshot` records are saved."""


class PodScopeSnapshot(msgspec.Struct, frozen=True):
    """What the agent was allowed to touch when the snapshot was taken."""

    working_dir: str | None = None
    allowed_paths: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    """Names of the tools the agent could call."""

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as a JSON-ready dict."""
        return {
            "working_dir": self.working_dir,
            "allowed_paths": list(self.allowed_paths),
            "tools": list(self.tools),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PodScopeSnapshot:
        """Rebuild a snapshot saved by :meth:`to_dict`."""
        return cls(
            working_dir=data.get("working_dir"),
            allowed_paths=tuple(data.get("allowed_paths") or ()),
            tools=tuple(data.get("tools") or ()),
        )


class EntryKind(StrEnum):
    """The kinds of log entry this version writes."""

    HEADER = "header"
    USER_INPUT = "user_input"
    ITEM = "item"
    SYSTEM_ITEM = "system_item"
    TURN_END = "turn_end"
    RUN_COMPLETED = "run_completed"
    RUN_ERRORED = "run_errored"
    USAGE = "usage"
    CONFIG_CHANGED = "config_changed"
    EXTENSION = "extension"


HISTORY_KINDS: frozenset[str] = frozenset(
    (EntryKind.USER_INPUT.value, EntryKind.ITEM.value, EntryKind.SYSTEM_ITEM.value)
)
"""The entry kinds that carry one history item."""

ENVELOPE_KEYS = ("v", "seq", "ts", "kind")


class LogEntry(msgspec.Struct, frozen=True):
    """One line of a segment log; ``data`` holds the kind's own keys as stored, unknown ones too."""

    seq: int
    """Position in the segment: 0 for the header, then 1, 2, ... without gaps."""
    kind: str
    """One of :class:`EntryKind`, or a kind written by a newer version."""
    ts: str
    """UTC wall-clock time of the write (RFC 3339). Informational; order comes from ``seq``."""
    data: Mapping[str, Any]
    v: int = FORMAT_VERSION
    """Format major version of the writer."""

    def to_dict(self) -> dict[str, Any]:
        """The entry as the JSON object stored on its line."""
        return {"v": self.v, "seq": self.seq, "ts": self.ts, "kind": self.kind, **self.data}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LogEntry:
        """Build an entry from a decoded line (see :meth:`to_dict`)."""
        return cls(
            seq=raw["seq"],
            kind=raw["kind"],
            ts=raw["ts"],
            data={k: v for k, v in raw.items() if k not in ENVELOPE_KEYS},
            v=raw.get("v", FORMAT_VERSION),
        )


class SegmentOrigin(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where a segment comes from. Written in its header."""

    kind: Literal["root", "fork", "compaction", "clear", "import"]
    parent: SegmentId | None = None
    """The segment this one branches from (fork, compaction, clear)."""
    at_seq: int | None = None
    """The last entry of ``parent`` that this segment continues from."""
    source: str | None = None
    """For imports: what was imported (a legacy file path, another store's URL)."""

    @classmethod
    def root(cls) -> SegmentOrigin:
        """A new conversation."""
        return cls("root")

    def to_dict(self) -> dict[str, Any]:
        """The origin as stored in a header (keys that are None left out)."""
        return cast(dict[str, Any], msgspec.to_builtins(self))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SegmentOrigin:
        """Rebuild an origin from a header."""
        parent = raw.get("parent")
        return cls(
            kind=raw["kind"],
            parent=uuid.UUID(parent) if parent else None,
            at_seq=raw.get("at_seq"),
            source=raw.get("source"),
        )


class SegmentStartState(msgspec.Struct, frozen=True):
    """What a new segment starts with."""

    system_prompt: str | None = None
    config: Mapping[str, Any] = msgspec.field(default_factory=dict)
    """Runtime settings (model, temperature, ...), replaced wholesale by config changes."""
    history: Sequence[Item | LoggedItem] = ()
    """Items the segment starts with (a compaction's summary, an import's messages)."""


class RunStatus(msgspec.Struct, frozen=True):
    """How the last run of a segment ended."""

    status: Literal["completed", "errored"]
    seq: int
    error: str | None = None


class TornTail(msgspec.Struct, frozen=True):
    """Bytes at the end of a segment that were not a complete entry (a writer died mid-line)."""

    segment_id: SegmentId
    offset: int
    """Byte offset in the segment where the torn bytes began."""
    size: int
    set_aside_to: str | None
    """Where the bytes were moved (a side file), or None where the store keeps no bytes."""


class RestoredState(msgspec.Struct):
    """What replaying a segment (and the ancestors it continues) yields."""

    session_id: SessionId
    segment_id: SegmentId
    context: str | None
    """The context the headers name: None for a session begun without one."""
    origin: SegmentOrigin
    system_prompt: str | None
    config: dict[str, Any]
    history: list[LoggedItem]
    """The conversation, oldest first, in on-disk form."""
    usage: UsageTotals
    extensions: dict[str, Any]
    """The latest value saved under each extension domain."""
    last_run: RunStatus | None
    next_seq: int
    """The sequence number the next append to this segment gets."""
    created_at: str
    """Timestamp of the segment's header."""
    last_active: str
    """Timestamp of the segment's last entry."""
    turns: int = 0
    """Turn ends in this segment's lineage."""
    unknown: list[dict[str, Any]] = msgspec.field(default_factory=list)
    """Entries of kinds this version does not know, as stored."""
    torn: list[TornTail] = msgspec.field(default_factory=list)
    """Torn tails that were detected and set aside during the restore."""
    failed: dict[int, Mapping[str, Any]] = msgspec.field(default_factory=dict)
    """The items of failed runs, by index in :attr:`history`, each with its ``run_errored``
    entry; kept in the history, not sent to the model (:attr:`model_history`)."""
    run_start: int = 0
    """Where in :attr:`history` the run under way began: the items past the last run's end."""
    usage_by_model: dict[str, UsageTotals] = msgspec.field(default_factory=dict)
    """:attr:`usage` per model (a usage record without a model under ``unknown``)."""

    def end_run(self, errored: Mapping[str, Any] | None = None) -> bool:
        """A run ended (``errored``: by ``run_errored``); whether that marked items failed.

        The failed-turn rule (docs/format.md §6): a ``run_errored`` fails the run's last block
        of user inputs and every item after it, when they follow the previous run's end.
        """
        history, start = self.history, self.run_start
        self.run_start = len(history)
        if errored is None:
            return False
        first = len(history)
        while first > start and item_role(history[first - 1]) != "user":
            first -= 1  # the run's own items after its input: its tool calls and results
        if first == start:
            return False
        while first - 1 > start and item_role(history[first - 2]) == "user":
            first -= 1  # inputs logged together (or one after another) are one run's
        for index in range(first - 1, len(history)):
            self.failed[index] = errored
        return True

    def failure(self, index: int) -> dict[str, Any] | None:
        """What every view shows of history item ``index`` when a run failed it (``show``, the
        dashboard, the exports): the run's ``error`` and ``error_type``, and on the run's last
        item its ``partial`` reply; None for an item of no failed run."""
        errored = self.failed.get(index)
        if errored is None:
            return None
        mark = {"error": errored.get("error"), "error_type": errored.get("error_type")}
        partial = errored.get("partial")
        if self.failed.get(index + 1) is not errored and isinstance(partial, str) and partial:
            mark["partial"] = partial
        return mark

    @property
    def model_history(self) -> list[LoggedItem]:
        """The history the model is sent, failed runs left out (read only)."""
        if not self.failed:
            return self.history
        failed = self.failed
        return [item for index, item in enumerate(self.history) if index not in failed]

    @property
    def pod_scope(self) -> PodScopeSnapshot | None:
        """The latest pod scope snapshot, if any was saved."""
        raw = self.extensions.get(POD_SCOPE_EXTENSION_DOMAIN)
        return PodScopeSnapshot.from_dict(raw) if raw is not None else None

    @property
    def message_count(self) -> int:
        """Number of history items."""
        return len(self.history)


class TraceEntry(msgspec.Struct, frozen=True):
    """A raw stream event, written to ``{segment}.trace.jsonl`` when tracing is on."""

    ts: str
    event: str
    """Event type (``request``, ``chunk``, ``response``, ``error``)."""
    data: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The trace line as a JSON-ready dict."""
        return {"ts": self.ts, "event": self.event, "data": dict(self.data)}
