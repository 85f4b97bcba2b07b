"""Adapters that put a terrarium store behind other frameworks' memory interfaces.

Each module is its own optional extra and imports its framework on import, so this package
imports nothing:

* :mod:`terrarium.integrations.openai_agents`: ``TerrariumSession``, the OpenAI Agents SDK's
  ``Session`` (extra ``openai-agents``).
* :mod:`terrarium.integrations.langgraph`: ``TerrariumSaver``, a LangGraph checkpointer
  (extra ``langgraph``).
"""
