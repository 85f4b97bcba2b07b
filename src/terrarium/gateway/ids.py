"""The gateway's ids: unguessable, and each names where its data lies in the store.

A conversation id is ``conv_`` and 26 base32 characters (128 random bits); its context is
``conv:{id}``. A response id is ``resp_``, a letter for its context's kind (``t`` for a
thread of responses, context ``resp:{token}``; ``c`` for a conversation), the context's
token, then 80 random bits of its own. So the id alone names the context, and the response
is found in that context's session tree by its id (the ``extension`` entry that records it);
nothing outside the log maps ids to places, and ids survive restarts with the log.
"""

from __future__ import annotations

import base64
import re
import secrets

from terrarium.model import ContextId

THREAD_TYPE = "resp"
"""The context type of a thread of responses chained by ``previous_response_id``."""
CONVERSATION_TYPE = "conv"
"""The context type of a conversation of the Conversations API."""
CHAT_TYPE = "chat"
"""The context type of a Chat Completions session named by a request."""

_TOKEN = 26
_SECRET = 16
_CONV_RE = re.compile(rf"conv_[a-z2-7]{{{_TOKEN}}}")
_RESP_RE = re.compile(rf"resp_([tc])([a-z2-7]{{{_TOKEN}}})[a-z2-7]{{{_SECRET}}}")


def _random(nbytes: int) -> str:
    return base64.b32encode(secrets.token_bytes(nbytes)).decode().rstrip("=").lower()


def new_token() -> str:
    """A fresh context token: 128 random bits in 26 base32 characters."""
    return _random(16)


def new_conversation_id() -> str:
    """A fresh conversation id."""
    return "conv_" + new_token()


def conversation_context(conversation_id: str) -> ContextId | None:
    """The context of a conversation id, or None when it is not one of ours."""
    if not isinstance(conversation_id, str) or not _CONV_RE.fullmatch(conversation_id):
        return None
    return ContextId(CONVERSATION_TYPE, conversation_id)


def thread_context(token: str) -> ContextId:
    """The context of a thread of responses."""
    return ContextId(THREAD_TYPE, token)


def new_response_id(context: ContextId | None) -> str:
    """A fresh response id in ``context`` (a thread or a conversation); None: one that names
    no context (``store: false``)."""
    secret = _random(10)
    if context is None:
        return "resp_x" + new_token() + secret
    if context.type == CONVERSATION_TYPE:
        return "resp_c" + context.name.removeprefix("conv_") + secret
    return "resp_t" + context.name + secret


def response_context(response_id: str) -> ContextId | None:
    """The context a response id names, or None when it names none."""
    if not isinstance(response_id, str):
        return None
    match = _RESP_RE.fullmatch(response_id)
    if match is None:
        return None
    kind, token = match.groups()
    if kind == "c":
        return ContextId(CONVERSATION_TYPE, "conv_" + token)
    return thread_context(token)


def new_item_id(kind: str) -> str:
    """A fresh item id with OpenAI's prefix for ``kind`` (``msg_``, ``fc_``, ...)."""
    prefix = _PREFIXES.get(kind, "item")
    return f"{prefix}_{secrets.token_hex(16)}"


_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}
