"""Removing one message, by id, from a thread's serialized values (LetheSaver.forget_message).

The server cannot read serde bytes, so the saver reads every blob and write of the thread, takes the message out of
each value that holds it, and sends the rewritten bytes back in one rewrite (app/threads/service.py `rewrite`).

A value holds the message when it is the message (a LangChain message whose `.id` is the id), or a container holding it
at any depth: a list, tuple or dict (a `messages` channel, a node's `{"messages": [...]}` output, the graph's input), a
dataclass, named tuple or pydantic state (rebuilt, same type, without it), or a `Send` (its argument rewritten). A field
or a `Send` argument that *is* the message has nowhere to be taken out of: the field becomes None, and the `Send` (a
pushed task that would carry nothing but the message) is removed from its container, as a message is."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.types import Send
from pydantic import BaseModel

from lethe_client.langgraph._wire import EMPTY, dumps, loads

_GONE = object()  # what a value that is the message becomes: removed from its container


def _fields_without(fields: dict[str, Any], message_id: str) -> dict[str, Any]:
    """The fields that held the message, rewritten (one that was the message: None)."""
    changed = {}
    for name, old in fields.items():
        new = _without(old, message_id)
        if new is not old:
            changed[name] = None if new is _GONE else new
    return changed


def _dataclass_without(value: Any, message_id: str) -> Any:
    """A copy of the dataclass (same type, every other field as it was: no __init__ or __post_init__ runs again)
    with the fields that held the message rewritten; frozen ones too."""
    changed = _fields_without({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, message_id)
    if not changed:
        return value
    rebuilt = copy.copy(value)
    for name, new in changed.items():
        object.__setattr__(rebuilt, name, new)
    return rebuilt


def _without(value: Any, message_id: str) -> Any:
    """`value` without the message, the same object when it did not hold it, `_GONE` when it was it."""
    if isinstance(value, BaseMessage):  # (a pydantic model too: tested first)
        return _GONE if value.id == message_id else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple: its type and arity kept
        named: Any = value
        changed = _fields_without(dict(zip(named._fields, named, strict=True)), message_id)
        return named._replace(**changed) if changed else value
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
    if isinstance(value, Send):
        arg = _without(value.arg, message_id)
        if arg is value.arg:
            return value
        return _GONE if arg is _GONE else Send(value.node, arg, timeout=value.timeout)
    if isinstance(value, BaseModel):
        model_fields = type(value).model_fields
        changed = _fields_without({name: getattr(value, name) for name in model_fields}, message_id)
        return value.model_copy(update=changed) if changed else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _dataclass_without(value, message_id)
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
