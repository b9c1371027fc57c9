"""Removing one message, by id, from a thread's serialized values (LetheSaver.forget_message).

The server cannot read serde bytes, so the saver reads every blob and write of the thread, takes the message out of
each value that holds it, and sends the rewritten bytes back in one rewrite (app/threads/service.py `rewrite`).

A value holds the message when it is the message (a LangChain message whose `.id` is the id), or a list, tuple or
dict holding it at any depth (a `messages` channel, a node's `{"messages": [...]}` output, the graph's input). Other
containers (dataclasses, pydantic states) are not searched: a state kept in one is not rewritten."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.base import SerializerProtocol

from lethe_client.langgraph._wire import EMPTY, dumps, loads

_GONE = object()  # what a value that is the message becomes: removed from its container


def _without(value: Any, message_id: str) -> Any:
    """`value` without the message, the same object when it did not hold it, `_GONE` when it was it."""
    if isinstance(value, BaseMessage):
        return _GONE if value.id == message_id else value
    if isinstance(value, list | tuple):
        kept = [_without(item, message_id) for item in value]
        if all(new is old for new, old in zip(kept, value, strict=True)):
            return value
        items = [item for item in kept if item is not _GONE]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        changed = {k: _without(v, message_id) for k, v in value.items()}
        if all(changed[k] is v for k, v in value.items()):
            return value
        return {k: v for k, v in changed.items() if v is not _GONE}
    return value


def rewrite_body(serde: SerializerProtocol, stored: dict[str, Any], message_id: str) -> dict[str, Any] | None:
    """The rewrite of a thread's values (`GET .../values`) without the message; None when no value holds it."""
    blobs, writes, dropped = [], [], []
    for blob in stored["blobs"]:
        if blob["type"] == EMPTY:
            continue
        old = loads(serde, blob["type"], blob["data"])
        new = _without(old, message_id)
        if new is old:
            continue
        # A channel whose whole value was the message keeps an empty list: LangGraph reads the blob by version.
        kind, data = dumps(serde, [] if new is _GONE else new)
        blobs.append({"checkpoint_ns": blob["checkpoint_ns"], "channel": blob["channel"], "version": blob["version"],
                      "type": kind, "data": data})
    for write in stored["writes"]:
        old = loads(serde, write["type"], write["data"])
        new = _without(old, message_id)
        if new is old:
            continue
        key = {k: write[k] for k in ("checkpoint_ns", "checkpoint_id", "task_id", "idx")}
        if new is _GONE:
            dropped.append(key)
        else:
            kind, data = dumps(serde, new)
            writes.append({**key, "type": kind, "data": data})
    if not (blobs or writes or dropped):
        return None
    return {"revision": stored["revision"], "blobs": blobs, "writes": writes, "drop_writes": dropped}
