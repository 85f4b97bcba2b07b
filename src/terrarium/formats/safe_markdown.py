"""Message text to safe HTML, shared by the dashboard and the HTML export.

markdown-it (CommonMark and tables) with raw HTML off, so markup in a message is escaped;
links only to http(s) and mailto; fenced code highlighted by Pygments into class names (the
dashboard's CSP forbids inline styles), styled by :func:`pygments_css`. Messages past
:data:`MARKDOWN_LIMIT` characters are plain preformatted text.
"""

from __future__ import annotations

from html import escape
from typing import Any

from markdown_it import MarkdownIt
from pygments import highlight as _pygmentize
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

MARKDOWN_LIMIT = 100_000
"""Longer messages are shown as plain preformatted text: Markdown over megabytes is slow and
helps nobody read."""

_SAFE_SCHEMES = ("http://", "https://", "mailto:")
_FORMATTER = HtmlFormatter(nowrap=True)


def _highlight(code: str, lang: str, _attrs: Any) -> str:
    if not lang:
        return ""  # markdown-it escapes it
    try:
        lexer = get_lexer_by_name(lang.split()[0])
    except ClassNotFound:
        return ""
    return str(_pygmentize(code, lexer, _FORMATTER))


def _valid_link(url: str) -> bool:
    return url.strip().lower().startswith(_SAFE_SCHEMES)


_MD = MarkdownIt("commonmark", {"html": False, "highlight": _highlight}).enable("table")
_MD.validateLink = _valid_link  # type: ignore[method-assign]


def markdown_html(text: str) -> str:
    """``text`` as safe HTML: Markdown, or plain preformatted text when very long."""
    if len(text) > MARKDOWN_LIMIT:
        return f'<pre class="plain">{escape(text)}</pre>'
    return str(_MD.render(text))


def code_html(text: str, lang: str = "json") -> str:
    """``text`` highlighted as ``lang`` (tool arguments and results), escaped."""
    highlighted = _highlight(text, lang, None) if len(text) <= MARKDOWN_LIMIT else ""
    return f"<pre><code>{highlighted or escape(text)}</code></pre>"


def pygments_css() -> str:
    """The style sheet of the highlighted code's class names."""
    # A list, not ".md pre, pre": Pygments puts the text before each class as it is, and the
    # bare ".md pre" of that string would get every token's style (a red border, italics).
    return str(HtmlFormatter(style="default").get_style_defs([".md pre", "pre"]))
