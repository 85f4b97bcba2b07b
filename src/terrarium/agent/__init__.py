"""The conversation runtime: many contexts over one model server."""

from __future__ import annotations

from terrarium.agent.multi_context_manager import MultiContextManager

__all__ = ["MultiContextManager"]
