"""``TerrariumSaver``: a LangGraph checkpointer (sync and async) over any terrarium store.

One LangGraph thread is one context, ``langgraph:{thread_id}``. Each ``put`` appends one
``extension`` entry of domain ``langgraph.checkpoint`` (checkpoint, metadata, parent and
changed channels, serialized by ``serde``, base64), each ``put_writes`` one of domain
``langgraph.writes``. A root graph's new ``messages`` are logged as history items in the same
write, so ``show``, search and export see them. A read replays the thread's entries; async
methods run the store in a worker thread. Needs the ``langgraph`` extra. Usage::

    with TerrariumSaver("sessions.db") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "t1"}})
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from terrarium import contexts, sessions
from terrarium.errors import TerrariumError, install_hint
from terrarium.lifecycle import delete_context
from terrarium.model import HISTORY_KINDS, ContextId, EntryKind, as_logged
from terrarium.stores.base import PodMetadata, Store, context_lock
from terrarium.stores.url import StoreUser

try:
    from langchain_core.messages import convert_to_openai_messages
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "terrarium.integrations.langgraph needs langgraph-checkpoint: " + install_hint("langgraph")
    ) from exc

__all__ = ["CHECKPOINT_DOMAIN", "DEFAULT_CONTEXT_TYPE", "WRITES_DOMAIN", "TerrariumSaver"]

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_TYPE = "langgraph"
"""The context type of a thread: ``langgraph:{thread_id}``."""
CHECKPOINT_DOMAIN = "langgraph.checkpoint"
"""The extension domain of a checkpoint entry."""
WRITES_DOMAIN = "langgraph.writes"
"""The extension domain of a pending-writes entry."""
MESSAGES_CHANNEL = "messages"

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass
class _Thread:
    """One thread's checkpoints, channel values and writes, replayed from its entries."""

    checkpoints: dict[str, dict[str, tuple[list[str], list[str], str | None]]] = field(
        default_factory=dict
    )
    """ns -> checkpoint id -> (checkpoint, metadata, parent id)."""
    blobs: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    """(ns, channel, version as JSON text) -> value."""
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, list[str], str]]] = field(
        default_factory=dict
    )
    """(ns, checkpoint id) -> (task id, index) -> (task id, channel, value, task path)."""
    message_ids: set[str] = field(default_factory=set)
    """The ids of the messages already logged as history items."""


def _in_thread(
    method: Callable[Concatenate[TerrariumSaver, _P], _R],
) -> Callable[Concatenate[TerrariumSaver, _P], Coroutine[Any, Any, _R]]:
    """The async twin of a saver method: the method, run in a worker thread."""

    async def twin(self: TerrariumSaver, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return await asyncio.to_thread(method, self, *args, **kwargs)

    twin.__doc__ = f":meth:`{method.__name__}` in a worker thread."
    return twin


class TerrariumSaver(BaseCheckpointSaver[str], StoreUser):
    """A LangGraph checkpointer keeping each thread in a terrarium context."""

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        *,
        context_type: str = DEFAULT_CONTEXT_TYPE,
        serde: SerializerProtocol | None = None,
    ) -> None:
        """Open the saver.

        Args:
            store: A store object (left open), or a store path or URL (opened and closed here).
            context_type: The type of the threads' contexts (``langgraph:{thread_id}``).
            serde: LangGraph's serializer for checkpoint values (its default if None).

        Raises:
            InvalidContextId: ``context_type`` is not a valid context type.
        """
        super().__init__(serde=serde)
        ContextId(context_type, "probe")  # validates the type in one line
        self.context_type = context_type
        self._use_store(store)

    def _dump(self, value: Any) -> list[str]:
        """``value`` serialized by ``serde``: its type and its bytes in base64."""
        kind, data = self.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode("ascii")]

    def _load(self, packed: Sequence[str]) -> Any:
        """The value :meth:`_dump` packed."""
        return self.serde.loads_typed((packed[0], base64.b64decode(packed[1])))

    def context_of(self, thread_id: str) -> ContextId:
        """The context that holds ``thread_id``; InvalidContextId if it cannot be a name."""
        return ContextId(self.context_type, str(thread_id))

    def _read(self, context: ContextId) -> _Thread | None:
        head = self.store.get_head(context)
        return None if head is None else self._replay(head)

    def _replay(self, head: PodMetadata) -> _Thread:
        thread = _Thread()
        for read in sessions.lineage(self.store, head.session_id, head.segment_id):
            for entry in read.entries:
                kind = entry["kind"]
                if kind in HISTORY_KINDS:
                    message_id = entry["item"].get("id")
                    if isinstance(message_id, str):
                        thread.message_ids.add(message_id)
                elif kind == EntryKind.EXTENSION:
                    if entry["domain"] == CHECKPOINT_DOMAIN:
                        _replay_checkpoint(thread, entry["data"])
                    elif entry["domain"] == WRITES_DOMAIN:
                        _replay_writes(thread, entry["data"])
        return thread

    def _tuple(
        self, thread_id: str, thread: _Thread, ns: str, checkpoint_id: str
    ) -> CheckpointTuple:
        packed, metadata, parent = thread.checkpoints[ns][checkpoint_id]
        checkpoint: Checkpoint = self._load(packed)
        values = {}
        for channel, version in checkpoint["channel_versions"].items():
            blob = thread.blobs.get((ns, channel, _version_key(version)))
            if blob is not None and blob[0] != "empty":
                values[channel] = self._load(blob)
        stored = thread.writes.get((ns, checkpoint_id), {})
        ordered = sorted(stored.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))
        return CheckpointTuple(
            config=_config(thread_id, ns, checkpoint_id),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self._load(metadata),
            pending_writes=[
                (task_id, channel, self._load(value))
                for task_id, channel, value, _ in (item for _, item in ordered)
            ],
            parent_config=_config(thread_id, ns, parent) if parent else None,
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the thread's latest in its namespace."""
        configurable = {"checkpoint_ns": "", **config["configurable"]}
        return next(iter(self.list({"configurable": configurable}, limit=1)), None)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, of ``config``'s thread (or all), matching every filter."""
        if config is not None:
            thread_ids = [str(config["configurable"]["thread_id"])]
            wanted_ns = config["configurable"].get("checkpoint_ns")
            wanted_id = get_checkpoint_id(config)
        else:
            thread_ids = [
                ContextId.parse(head.context).name
                for head in self.store.list_contexts(self.context_type)
            ]
            wanted_ns, wanted_id = None, None
        before_id = get_checkpoint_id(before) if before else None
        for thread_id in thread_ids:
            thread = self._read(self.context_of(thread_id))
            if thread is None:
                continue
            for ns, checkpoints in thread.checkpoints.items():
                if wanted_ns is not None and ns != wanted_ns:
                    continue
                for checkpoint_id in sorted(checkpoints, reverse=True):
                    if wanted_id and checkpoint_id != wanted_id:
                        continue
                    if before_id and checkpoint_id >= before_id:
                        continue
                    found = self._tuple(thread_id, thread, ns, checkpoint_id)
                    if filter and not all(
                        found.metadata.get(key) == value for key, value in filter.items()
                    ):
                        continue
                    if limit is not None and limit <= 0:
                        return
                    if limit is not None:
                        limit -= 1
                    yield found

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Log a checkpoint (and the messages it adds); return the config that names it."""
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        values = checkpoint["channel_values"]
        bare = {key: value for key, value in checkpoint.items() if key != "channel_values"}
        # Only the channels this checkpoint changed are stored; _tuple gathers the others from
        # the versions that changed them, as LangGraph's own savers do.
        data = {
            "ns": ns,
            "id": checkpoint["id"],
            "parent": configurable.get("checkpoint_id"),
            "checkpoint": self._dump(bare),
            "metadata": self._dump(get_checkpoint_metadata(config, metadata)),
            "blobs": [
                [
                    channel,
                    version,
                    self._dump(values[channel]) if channel in values else ["empty", ""],
                ]
                for channel, version in new_versions.items()
            ],
        }
        messages = values.get(MESSAGES_CHANNEL) if ns == "" else None
        self._append(thread_id, data, messages if MESSAGES_CHANNEL in new_versions else None)
        return _config(thread_id, ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Log the writes a task made towards the checkpoint ``config`` names."""
        configurable = config["configurable"]
        data = {
            "ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": configurable["checkpoint_id"],
            "task_id": task_id,
            "task_path": task_path,
            "writes": [
                [WRITES_IDX_MAP.get(channel, idx), channel, self._dump(value)]
                for idx, (channel, value) in enumerate(writes)
            ],
        }
        self._append(str(configurable["thread_id"]), data, None, domain=WRITES_DOMAIN)

    def _append(
        self,
        thread_id: str,
        data: dict[str, Any],
        messages: Any,
        *,
        domain: str = CHECKPOINT_DOMAIN,
    ) -> None:
        context = self.context_of(thread_id)
        contexts.check_new_name(self.store, context)  # before its lock file is made
        with context_lock(self.store, context):
            head = self.store.get_head(context) or sessions.create_or_join(self.store, context)
            entries: list[tuple[str, dict[str, Any]]] = [
                (EntryKind.EXTENSION.value, {"domain": domain, "data": data})
            ]
            if messages:
                entries += _new_message_entries(messages, self._replay(head).message_ids)
            sessions.append_entries(self.store, head, entries)

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's context: every checkpoint, write and logged message of it."""
        delete_context(self.store, self.context_of(str(thread_id)))

    aget_tuple = _in_thread(get_tuple)
    aput = _in_thread(put)
    aput_writes = _in_thread(put_writes)
    adelete_thread = _in_thread(delete_thread)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """:meth:`list`, read in a worker thread."""
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _version_key(version: Any) -> str:
    """A channel version as a dict key (an int version stays distinct from its string)."""
    return repr(version)


def _replay_checkpoint(thread: _Thread, data: dict[str, Any]) -> None:
    ns = data["ns"]
    thread.checkpoints.setdefault(ns, {})[data["id"]] = (
        data["checkpoint"],
        data["metadata"],
        data["parent"],
    )
    for channel, version, value in data["blobs"]:
        thread.blobs[(ns, channel, _version_key(version))] = value


def _replay_writes(thread: _Thread, data: dict[str, Any]) -> None:
    stored = thread.writes.setdefault((data["ns"], data["checkpoint_id"]), {})
    task_id = data["task_id"]
    for idx, channel, value in data["writes"]:
        key = (task_id, idx)
        if idx >= 0 and key in stored:
            continue  # a task's regular writes are kept once; special ones are replaced
        stored[key] = (task_id, channel, value, data["task_path"])


def _new_message_entries(messages: Any, logged: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """History entries for the messages not yet logged, by id (a removed message stays logged)."""
    if not isinstance(messages, list):
        return []
    entries: list[tuple[str, dict[str, Any]]] = []
    for message in messages:
        message_id = getattr(message, "id", None)
        if isinstance(message, dict):
            message_id = message.get("id")
        if not isinstance(message_id, str) or message_id in logged:
            continue
        try:
            item = as_logged({**convert_to_openai_messages(message), "id": message_id})
        except (TerrariumError, ValueError, TypeError, NotImplementedError) as exc:
            log.warning("message %s is not logged as an item: %s", message_id, exc)
            continue
        logged.add(message_id)
        entries.append((sessions.classify_history_item(item).value, {"item": item}))
    return entries
