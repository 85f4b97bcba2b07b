"""Text quoted from the seed documents (``../shared/seeds``), for tests that compare with it."""

from __future__ import annotations

SEED_FILE = """\
{
  "session_id": "main",
  "context_type": "cli",
  "system_prompt": "You are a helpful AI assistant.",
  "messages": [
    {
      "role": "user",
      "content": "Hello!",
      "timestamp": "2025-11-06T14:30:00.123456"
    },
    {
      "role": "assistant",
      "content": "Hi! How can I help you?",
      "timestamp": "2025-11-06T14:30:03.456789"
    }
  ],
  "metadata": {
    "created_at": "2025-11-06T14:30:00.123456",
    "last_active": "2025-11-06T14:35:12.987654",
    "message_count": 10,
    "session_id": "main",
    "context_type": "cli",
    "session_date": "2025-11-06"
  }
}
"""
"""The "Session File Format" example of seeds/004, verbatim."""
