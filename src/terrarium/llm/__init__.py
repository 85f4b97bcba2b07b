"""Model clients: talk to an OpenAI-compatible chat server (vLLM, llama.cpp, Ollama, OpenAI).

:class:`ModelAccess` says how to reach one. The client's names are imported on first use: a
caller that only holds a :class:`ModelAccess` never imports ``openai`` (~0.5 s)."""

from __future__ import annotations

from dataclasses import dataclass

from terrarium._lazy import attach

TYPE_CHECKING = False  # typing's costs more to import than this whole module
if TYPE_CHECKING:  # ``X as X``: a type checker sees each name re-exported
    from terrarium.llm.vllm_client import ChatResult as ChatResult
    from terrarium.llm.vllm_client import StreamEvent as StreamEvent
    from terrarium.llm.vllm_client import VLLMClient as VLLMClient

_CLIENT_NAMES = dict.fromkeys(
    ("ChatResult", "StreamEvent", "VLLMClient"), f"{__name__}.vllm_client"
)
__all__ = ["ModelAccess", *_CLIENT_NAMES]
__getattr__, __dir__ = attach(__name__, _CLIENT_NAMES, __all__)


@dataclass(frozen=True)
class ModelAccess:
    """How to reach the model server (``--base-url``, ``--model``, ``--retries``, ``--timeout``)."""

    base_url: str
    """The OpenAI-compatible server (``http://localhost:8000/v1``)."""
    model: str | None = None
    """The model to ask; None: the first one the server lists."""
    retries: int = 2
    """Retries of a failed request (connection errors, 429, 5xx)."""
    timeout: float = 60.0
    """Seconds to wait for the server to connect or send the next piece."""

    def client(self) -> VLLMClient:
        """A new client for this server (it connects on first use)."""
        from terrarium.llm.vllm_client import VLLMClient

        return VLLMClient(
            self.base_url, model=self.model, max_retries=self.retries, timeout=self.timeout
        )
