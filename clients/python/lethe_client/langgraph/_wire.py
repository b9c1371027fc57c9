"""What LetheSaver sends to the thread routes and how it reads the answers, written once for its sync and async
methods (docs/API.md "Threads (LangGraph checkpoints)").

The server never decodes a checkpoint: every value travels as the saver's serde `(type, bytes)`, the bytes in base64.
It reads only the metadata (list filters, `run_id`) and each checkpoint's channel versions (which blobs it holds)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

# Where a config carries the thread generation its checkpoint was read at: every put and put_writes built on that
# checkpoint names it, so a rewrite (forget_message) in between refuses them. "__" keeps it out of the metadata
# (langgraph.checkpoint.base.get_checkpoint_metadata skips such keys).
GENERATION = "__lethe_generation"
# A channel that a checkpoint lists as new but holds no value for (LangGraph's savers store the same marker).
EMPTY = "empty"
PAGE = 100


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    params: dict[str, str | int] = field(default_factory=dict)
    json: Any = None


def _seg(value: str) -> str:
    return quote(value, safe="")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _typed(serde: SerializerProtocol, value: Any) -> dict[str, str]:
    kind, data = serde.dumps_typed(value)
    return {"type": kind, "data": _b64(data)}


def loads(serde: SerializerProtocol, kind: str, data: str) -> Any:
    return serde.loads_typed((kind, base64.b64decode(data)))


def dumps(serde: SerializerProtocol, value: Any) -> tuple[str, str]:
    kind, data = serde.dumps_typed(value)
    return kind, _b64(data)


def thread_of(config: RunnableConfig) -> tuple[str, str, str | None]:
    """(thread_id, checkpoint_ns, checkpoint_id) of a config."""
    conf = config["configurable"]
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")), conf.get("checkpoint_id")


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str, generation: int) -> RunnableConfig:
    return {"configurable": {
        "thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id, GENERATION: generation,
    }}


def put(
    serde: SerializerProtocol, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> Request:
    thread_id, checkpoint_ns, parent_id = thread_of(config)
    bare: dict[str, Any] = dict(checkpoint)
    values: dict[str, Any] = bare.pop("channel_values", {})  # stored once per version, as blobs
    blobs = []
    for channel, version in new_versions.items():
        kind, data = dumps(serde, values[channel]) if channel in values else (EMPTY, "")
        blobs.append({"channel": channel, "version": str(version), "type": kind, "data": data})
    return Request("PUT", f"/v1/threads/{_seg(thread_id)}/checkpoints/{_seg(checkpoint['id'])}", json={
        "checkpoint_ns": checkpoint_ns, "parent_id": parent_id,
        "generation": config["configurable"].get(GENERATION),
        "checkpoint": _typed(serde, bare),
        "metadata": get_serializable_checkpoint_metadata(config, metadata),
        "channel_versions": {k: str(v) for k, v in checkpoint["channel_versions"].items()},
        "blobs": blobs,
    })


def put_done(config: RunnableConfig, checkpoint: Checkpoint, answer: dict[str, Any]) -> RunnableConfig:
    thread_id, checkpoint_ns, _ = thread_of(config)
    return _config(thread_id, checkpoint_ns, checkpoint["id"], int(answer["generation"]))


def put_writes(
    serde: SerializerProtocol, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
    task_path: str,
) -> Request:
    thread_id, checkpoint_ns, checkpoint_id = thread_of(config)
    if checkpoint_id is None:
        raise ValueError("put_writes needs a config with a checkpoint_id")
    body = [
        {"idx": WRITES_IDX_MAP.get(channel, idx), "channel": channel, **_typed(serde, value)}
        for idx, (channel, value) in enumerate(writes)
    ]
    return Request("POST", f"/v1/threads/{_seg(thread_id)}/checkpoints/{_seg(checkpoint_id)}/writes", json={
        "checkpoint_ns": checkpoint_ns, "task_id": task_id, "task_path": task_path,
        "generation": config["configurable"].get(GENERATION), "writes": body,
    })


def get_one(config: RunnableConfig) -> Request:
    """The checkpoint the config names, or (no checkpoint_id) the newest of its namespace: a page of one."""
    thread_id, checkpoint_ns, checkpoint_id = thread_of(config)
    if checkpoint_id:
        return Request("GET", f"/v1/threads/{_seg(thread_id)}/checkpoints/{_seg(checkpoint_id)}",
                       params={"checkpoint_ns": checkpoint_ns})
    return Request("GET", f"/v1/threads/{_seg(thread_id)}/checkpoints",
                   params={"checkpoint_ns": checkpoint_ns, "limit": 1})


def page(
    config: RunnableConfig | None, *, filter: dict[str, Any] | None, before: RunnableConfig | None,
    limit: int | None, cursor: str | None,
) -> Request:
    """A page of one thread's checkpoints; of every thread's (LangGraph's `list(None)`) when the config names no
    thread."""
    conf = (config or {}).get("configurable", {})
    params: dict[str, str | int] = {"limit": min(limit, PAGE) if limit is not None else PAGE}
    if "checkpoint_ns" in conf:
        params["checkpoint_ns"] = str(conf["checkpoint_ns"])
    if before is not None and before["configurable"].get("checkpoint_id"):
        params["before"] = str(before["configurable"]["checkpoint_id"])
    if filter:
        params["metadata"] = json.dumps(filter, separators=(",", ":"))
    if cursor is not None:
        params["cursor"] = cursor
    if "thread_id" not in conf:
        return Request("GET", "/v1/threads:checkpoints", params=params)
    return Request("GET", f"/v1/threads/{_seg(str(conf['thread_id']))}/checkpoints", params=params)


def tuple_of(serde: SerializerProtocol, item: dict[str, Any]) -> CheckpointTuple:
    """A checkpoint as the routes answer it → LangGraph's tuple."""
    checkpoint: Checkpoint = loads(serde, item["checkpoint"]["type"], item["checkpoint"]["data"])
    checkpoint["channel_values"] = {
        b["channel"]: loads(serde, b["type"], b["data"]) for b in item["blobs"] if b["type"] != EMPTY
    }
    thread_id, checkpoint_ns = item["thread_id"], item["checkpoint_ns"]
    parent = item["parent_id"]
    return CheckpointTuple(
        config=_config(thread_id, checkpoint_ns, item["checkpoint_id"], int(item["generation"])),
        checkpoint=checkpoint,
        metadata=item["metadata"],
        parent_config=(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": parent}}
            if parent else None
        ),
        pending_writes=[(w["task_id"], w["channel"], loads(serde, w["type"], w["data"])) for w in item["writes"]],
    )


def delete_thread(thread_id: str) -> Request:
    return Request("DELETE", f"/v1/threads/{_seg(str(thread_id))}")


def delete_for_runs(run_ids: Sequence[str]) -> Request:
    return Request("POST", "/v1/threads:delete_for_runs", json={"run_ids": [str(r) for r in run_ids]})


def copy_thread(source_thread_id: str, target_thread_id: str) -> Request:
    return Request("POST", f"/v1/threads/{_seg(str(source_thread_id))}/copy",
                   json={"target_thread_id": str(target_thread_id)})


def prune(thread_ids: Sequence[str], strategy: str) -> Request:
    return Request("POST", "/v1/threads:prune", json={"thread_ids": [str(t) for t in thread_ids], "strategy": strategy})


def values(thread_id: str) -> Request:
    return Request("GET", f"/v1/threads/{_seg(str(thread_id))}/values")


def rewrite(thread_id: str, body: dict[str, Any]) -> Request:
    return Request("POST", f"/v1/threads/{_seg(str(thread_id))}/rewrite", json=body)
