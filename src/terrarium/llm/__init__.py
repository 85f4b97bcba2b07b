"""Model clients: talk to an OpenAI-compatible chat server (vLLM, llama.cpp, Ollama, OpenAI)."""

from __future__ import annotations

from terrarium.llm.vllm_client import ChatResult, StreamEvent, VLLMClient

__all__ = ["ChatResult", "StreamEvent", "VLLMClient"]
