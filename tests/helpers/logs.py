"""Reading a context's log as the tests check it: the lines of its head segment, as written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from terrarium import FsStore
from terrarium.model import ContextId


def segment_lines(root: Path, context: str) -> list[dict[str, Any]]:
    """Every line of the context's head segment in the filesystem store at ``root``."""
    with FsStore(root) as store:
        head = store.get_head(ContextId.parse(context))
        folder = store.folder_of(ContextId.parse(context))
        assert head is not None and folder is not None
        text = (folder / f"{head.segment_id}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]
