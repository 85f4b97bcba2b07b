"""``terrarium gateway`` in front of a real OpenAI-compatible server: llama.cpp's, on the
tiny model (opt-in, ``make test-real-model``; see conftest.py)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from helpers.gateway import GatewayProcess

from .conftest import LlamaServer

pytestmark = pytest.mark.real_model


def test_responses_conversations_and_chat_through_the_gateway(
    llama_server: LlamaServer, tmp_path: Path
) -> None:
    """A chain, a fork, a stream, a conversation and a recorded chat session, each answered
    by the real server and kept."""
    model = str(llama_server.model_path)
    with GatewayProcess(tmp_path / "sessions", f"{llama_server.root_url}/v1") as gw:
        with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as client:
            first = client.responses.create(model=model, input="Hello", max_output_tokens=8)
            assert first.status in ("completed", "incomplete") and first.output_text
            second = client.responses.create(
                model=model, input="More", previous_response_id=first.id, max_output_tokens=8
            )
            fork = client.responses.create(
                model=model, input="Other", previous_response_id=first.id, max_output_tokens=8
            )
            for response in (first, second, fork):
                assert client.responses.retrieve(response.id).output_text == response.output_text
            with client.responses.create(
                model=model, input="Stream", stream=True, max_output_tokens=8
            ) as stream:
                kinds = [event.type for event in stream]
            assert kinds[0] == "response.created"
            assert kinds[-1] in ("response.completed", "response.incomplete")
            conversation = client.conversations.create()
            client.responses.create(
                model=model,
                input="In a conversation",
                conversation=conversation.id,
                max_output_tokens=8,
            )
            assert len(list(client.conversations.items.list(conversation.id))) == 2
            chat = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=8,
                extra_headers={"X-Session-Id": "real"},
            )
            assert chat.choices[0].message.content
