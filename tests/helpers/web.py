"""A small store with everything the dashboard shows, and hostile content, for web tests."""

from __future__ import annotations

from terrarium.model import ContextId, SegmentStartState, UsageRecord
from terrarium.sessions import (
    create_compacted_segment,
    create_segment,
    fork_at,
    save_delta,
    save_turn_end,
    save_usage,
    save_user_input,
)
from terrarium.stores.base import Store

HOSTILE_NAME = '<img src=x onerror=alert(1)>&evil"q'
"""A context name (of type ``cli``) made to inject markup. (New names may not hold RTL
overrides: ``ContextId.check_new`` refuses them; messages hold them instead.)"""

HOSTILE_TEXTS = (
    "<script>window.__pwned = 1; alert('x')</script>",
    "<img src=x onerror=\"window.__pwned = 2; alert('img')\">",
    "[click me](javascript:alert('link')) and [fine](https://example.org/ok)",
    "</textarea><svg onload=alert(3)></svg>",
    "right-to-left \u202eoverride\u202c done",
)


def head(store: Store, context: str):  # type: ignore[no-untyped-def]
    """The context's head (asserted to exist)."""
    found = store.get_head(ContextId.parse(context))
    assert found is not None
    return found


def turn(store: Store, context: str, question: str, answer: str, model: str = "qwen") -> None:
    """One user question and assistant answer, with usage and a turn end."""
    ref = head(store, context)
    save_user_input(store, ref, question)
    save_delta(store, ref, [{"role": "assistant", "content": answer}])
    save_usage(store, ref, UsageRecord(model, 100, 20, 10))
    save_turn_end(store, ref)


def long_turns(store: Store, context: str, count: int = 3) -> None:
    """``count`` long turns on an existing context: a summary of the oldest is shorter than
    they are, so a compaction that keeps the last four messages makes the context smaller."""
    for n in range(count):
        turn(store, context, f"question {n} " + "words " * 40, f"answer {n} " + "x " * 40)


def seed(store: Store) -> None:
    """Three contexts of two types: turns, a tool call and result, reasoning, code, a fork and
    a compaction."""
    create_segment(store, SegmentStartState(system_prompt="Be brief."), context="cli:main")
    turn(store, "cli:main", "What is a fork tree?", "A tree of **segments**.")
    turn(store, "cli:main", "Show code", "```python\ndef hello():\n    return 42\n```")
    ref = head(store, "cli:main")
    save_user_input(store, ref, "What is the weather?")
    save_delta(
        store,
        ref,
        [
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "I should call the weather tool.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'},
            {"role": "assistant", "content": "It is 3 degrees in Oslo."},
        ],
    )
    save_usage(store, ref, UsageRecord("llama", 50, 5, 0))
    save_turn_end(store, ref)
    fork_at(store, ref, 3)
    create_segment(store, None, context="irc:#python")
    turn(store, "irc:#python", "decorators please", "A decorator wraps a function.")
    create_segment(store, None, context="cli:compacted")
    turn(store, "cli:compacted", "long talk", "long answer")
    create_compacted_segment(
        store,
        head(store, "cli:compacted"),
        [{"role": "assistant", "content": "Summary: they talked at length."}],
        context="cli:compacted",
    )


def seed_hostile(store: Store) -> None:
    """A context with a hostile name and hostile messages, one of them 1 MB long."""
    create_segment(store, None, context=ContextId("cli", HOSTILE_NAME))
    ref = head(store, f"cli:{HOSTILE_NAME}")
    save_delta(store, ref, [{"role": "user", "content": text} for text in HOSTILE_TEXTS])
    big = ("<script>alert('big')</script> " * 35_000)[:1_000_000]
    save_delta(store, ref, [{"role": "assistant", "content": big, "name": "<b>nick</b>"}])
