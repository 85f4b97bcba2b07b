"""The rule a requested compaction must pass: the summary makes the context smaller.

On a short context a summary can be as long as what it replaces, which would grow every later
prompt. ``compact_context(only_if_smaller=True)`` (the command line's) then raises
:class:`~terrarium.errors.NothingToCompact` and writes only the call's usage; automatic
compactions (``token_budget``) do not ask.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from terrarium.errors import NothingToCompact
from terrarium.model import ContextId, chat_view, item_text


def size(items: Sequence[Mapping[str, Any]]) -> int:
    """Characters of text in ``items``: their content and their tool calls' arguments."""
    total = 0
    for item in items:
        total += len(item_text(item))
        view = chat_view(item) or {}  # a Responses function_call's arguments count too
        for call in view.get("tool_calls") or []:
            total += len(str((call.get("function") or {}).get("arguments", "")))
    return total


def check_replaces(context: ContextId, replaced: Sequence[Mapping[str, Any]], kept: int) -> None:
    """Refuse (NothingToCompact) before asking the model when nothing precedes the kept tail."""
    if not replaced:
        held = f"all {kept} of its messages are recent ones"
        if kept == 1:
            held = "its one message is a recent one"
        raise NothingToCompact(
            f"{context} not compacted: {held} a compaction keeps as they are, so there is "
            "nothing to summarise"
        )


def check_shrinks(
    context: ContextId,
    replaced: Sequence[Mapping[str, Any]],
    summary: Sequence[Mapping[str, Any]],
) -> None:
    """Refuse (NothingToCompact) a summary not smaller than the messages it would replace."""
    old, new = size(replaced), size(summary)
    if new >= old:
        count = len(replaced)
        raise NothingToCompact(
            f"{context} not compacted: the summary ({new} characters) would not be shorter than "
            f"the {count} message{'' if count == 1 else 's'} it replaces ({old} characters)"
        )


__all__ = ["check_replaces", "check_shrinks", "size"]
