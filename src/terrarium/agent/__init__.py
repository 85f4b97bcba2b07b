"""The conversation runtime: many contexts over one model server, each a persistent session."""

from __future__ import annotations

from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.agent.session_manager import PersistentSession

__all__ = ["MultiContextManager", "PersistentSession"]
