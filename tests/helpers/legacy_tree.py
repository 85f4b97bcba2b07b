"""A legacy sessions folder for the race and kill tests of ``migrate`` and ``import``, and
what its files hold."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from terrarium import ContextId
from terrarium.formats import terrarium_json as tj


def legacy_texts(name: str) -> list[str]:
    """The messages the legacy file of ``name`` holds."""
    return [f"{name} m{k}" for k in range(3)]


def write_legacy(root: Path, names: list[str]) -> None:
    """A legacy file for each context: a flat one, a top-level one or a dated one in turn;
    the n-th created on 2025-03-{n+1}."""
    for number, name in enumerate(names):
        context = ContextId.parse(name)
        created = f"2025-03-{1 + number:02d}T10:00:00"
        data = {
            "session_id": context.name,
            "context_type": context.type,
            "system_prompt": f"prompt of {name}",
            "metadata": {"created_at": created},
            "messages": [{"role": "user", "content": t} for t in legacy_texts(name)],
        }
        place = [
            root / context.type / f"{context.name}.json",
            root / f"{context.name}.json",
            root / context.type / created[:10] / f"{context.name}.json",
        ][number % 3]
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_text(json.dumps(data), encoding="utf-8")


def outside_trash(root: Path) -> Counter[str]:
    """The contexts the legacy files outside the trash hold (each file whole)."""
    found: Counter[str] = Counter()
    for path in tj.iter_legacy_files(root):
        session = tj.load(path, root=root)
        assert [m.content for m in session.messages] == legacy_texts(str(session.context)), path
        found[str(session.context)] += 1
    return found
