"""Adapters that put a terrarium store behind other frameworks' memory interfaces.

Each module imports its framework and is its own extra: :mod:`.openai_agents`
(``TerrariumSession``, extra ``openai-agents``) and :mod:`.langgraph` (``TerrariumSaver``,
extra ``langgraph``).
"""
