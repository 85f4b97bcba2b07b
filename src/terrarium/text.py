"""Search text handling, with no I/O: what every store's search agrees on about words.

How an item's text is indexed, what a token is and how it folds (lower case, no accents), how
the user's words become terms, and where matches lie (:func:`match_spans`), so every backend
and the scan fallback highlight the same characters. Usage::

    terms = query_terms("Decorators café")        # ["Decorators", "café"]
    phrases = [tokenize(term) for term in terms]   # [["decorators"], ["cafe"]]
    match_spans("A café with decorators", phrases)  # [(2, 6), (12, 22)]
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence

from terrarium.errors import InvalidQuery

#: The characters that mark a highlight in a snippet; text holding them is indexed with
#: U+FFFD instead, so a marker is never confused with the text.
HIGHLIGHT_OPEN, HIGHLIGHT_CLOSE = "\ue000", "\ue001"
#: What stands for cut text at either end of a snippet.
ELLIPSIS = "…"
#: How many tokens an FTS5 snippet holds.
SNIPPET_TOKENS = 24
#: What :func:`prepare_text` puts around each CJK character: a separator to a tokenizer.
SEPARATOR = "\x1f"
_CJK = (
    "\u1100-\u11ff\u3005-\u3007\u3040-\u309f\u30a0-\u30ff\u3100-\u312f\u3130-\u318f"
    "\u31a0-\u31bf\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7af"
    "\ud7b0-\ud7ff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f"
)


@functools.cache
def _cjk_re() -> re.Pattern[str]:
    # Compiling the CJK classes takes ~15 ms each, a tenth of a command line start: done by
    # the first text that needs them (most text is ASCII and never does).
    return re.compile(f"([{_CJK}])")


@functools.cache
def token_re() -> re.Pattern[str]:
    """A word as the FTS5 tokenizer sees it (each CJK character is a word of its own)."""
    return re.compile(f"[{_CJK}]|(?:[^\\W_{_CJK}]|[\ue002-\uf8ff])+")


_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")
_MARKERS = str.maketrans({HIGHLIGHT_OPEN: "\ufffd", HIGHLIGHT_CLOSE: "\ufffd"})
_SNIPPET_SPLIT = re.compile(f"([{HIGHLIGHT_OPEN}{HIGHLIGHT_CLOSE}])")
#: A scanned hit's snippet: about this many characters, from this many before the first match.
_SNIPPET_CHARS = 200
_CONTEXT_CHARS = 60


def prepare_text(text: str) -> str:
    """The text as indexed: NFC, marker characters replaced, CJK characters set apart."""
    if not text.isascii():
        text = unicodedata.normalize("NFC", text).translate(_MARKERS)
        text = _cjk_re().sub(f"{SEPARATOR}\\1{SEPARATOR}", text)
    return text


def fold(token: str) -> str:
    """A token as FTS5 compares it: lower-cased, without accents."""
    if token.isascii():
        return token.lower()
    decomposed = unicodedata.normalize("NFD", token)
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn").lower()


def tokenize(text: str) -> list[str]:
    """The tokens FTS5 finds in ``text``: letter and digit runs, folded; each CJK character one.

    SQLite's tokenizer uses older Unicode tables, so rare scripts and recent emoji can differ.
    """
    return [fold(m.group()) for m in token_re().finditer(text)]


def query_terms(text: str) -> list[str]:
    """The user's terms with something to search for, as indexed; else InvalidQuery."""
    if not isinstance(text, str):
        raise InvalidQuery(f"a search query must be a string, not {type(text).__name__}")
    terms = []
    for raw in _CONTROL_RE.sub(" ", text).split():
        term = prepare_text(raw)
        if token_re().search(term):
            terms.append(term)
    if not terms:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise InvalidQuery(
            f"nothing to search for in {shown!r}: a query needs at least one letter or digit"
        )
    return terms


def phrase_count(tokens: Sequence[str], phrase: Sequence[str]) -> int:
    """How many times ``phrase`` occurs in ``tokens`` (overlapping, as FTS5 counts)."""
    if not phrase:
        return 0
    n = len(phrase)
    first = phrase[0]
    return sum(
        1
        for i, token in enumerate(tokens)
        if token == first and list(tokens[i : i + n]) == list(phrase)
    )


def match_spans(text: str, phrases: Sequence[Sequence[str]]) -> list[tuple[int, int]]:
    """Where ``phrases`` (lists of folded tokens) occur in ``text``, sorted, as FTS5 marks them.

    Overlapping occurrences are one span; touching ones (two CJK characters) stay apart.
    """
    spans = [(fold(m.group()), m.start(), m.end()) for m in token_re().finditer(text)]
    tokens = [token for token, _, _ in spans]
    found: list[tuple[int, int]] = []
    for phrase in phrases:
        n = len(phrase)
        for i in range(len(tokens) - n + 1):
            if n and tokens[i : i + n] == list(phrase):
                found.append((spans[i][1], spans[i + n - 1][2]))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def scan_snippet(
    text: str, phrases: Sequence[Sequence[str]]
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """A window of ``text`` around the first match, every match in it highlighted."""
    merged = match_spans(text, phrases)
    begin = 0
    if len(text) > _SNIPPET_CHARS and merged:
        begin = max(0, merged[0][0] - _CONTEXT_CHARS)
        begin = next((m.start() for m in token_re().finditer(text) if m.start() >= begin), begin)
    end = min(len(text), begin + _SNIPPET_CHARS)
    prefix = ELLIPSIS if begin > 0 else ""
    suffix = ELLIPSIS if end < len(text) else ""
    shift = len(prefix) - begin
    highlights = tuple(
        (start + shift, stop + shift) for start, stop in merged if start >= begin and stop <= end
    )
    return f"{prefix}{text[begin:end]}{suffix}", highlights


def snippet_spans(marked: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """Strip the markers and separators from a marked snippet; return it and its highlights."""
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    length = 0
    start = -1
    for part in _SNIPPET_SPLIT.split(marked):
        if part == HIGHLIGHT_OPEN:
            start = length
        elif part == HIGHLIGHT_CLOSE:
            if start >= 0 and length > start:
                spans.append((start, length))
            start = -1
        elif part:
            part = part.replace(SEPARATOR, "")
            out.append(part)
            length += len(part)
    return "".join(out), tuple(spans)
