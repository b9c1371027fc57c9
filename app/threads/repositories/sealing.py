"""Thread data at rest: every checkpoint, channel value and pending write sealed under a leaf of its own row.

One leaf per row (docs/erasure-at-rest.md: one leaf = one erasure unit): a checkpoint's bytes and metadata share
their row's leaf, each blob version and each pending write has its own, all drawn from the thread's stream, so a
thread's leaves are neighbours and a thread deletion punctures a few subtrees. A delete, a prune, a run deletion or
a rewrite (forget_message) then destroys exactly what it removed or replaced: the leaves of those rows, and no other.

The binding names the tenant, the table, the row as its primary key after the tenant in JSON (`[thread, ns,
checkpoint]`, `[thread, ns, channel, version]`, `[thread, ns, checkpoint, task, idx]`: no separator a name could
hold makes two rows alike) and the column, so a ciphertext copied to another row, thread, table or tenant does not
open (`Tampered`). The bytes are sealed in place (migration 0020): `leaf` NULL means a row from before 0020, whose
plaintext is read as before.

A row whose leaf is punctured under a live row (a backup restored from before a delete, or a replica that has not
replayed it yet) reads as absent: the checkpoint is not there, the blob or write is left out. The delete that shredded
it meant exactly that, and LangGraph knows how to read a missing checkpoint or channel; a 5xx would make every read of
the thread fail.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any

from app.db.statements import Row
from app.keys.content import Sealer
from app.keys.envelope import Binding
from app.keys.errors import Erased
from app.keys.sealed import SealedColumn

CHECKPOINTS = "thread_checkpoints"
BLOBS = "thread_blobs"
WRITES = "thread_writes"


def stream(thread_id: str) -> Hashable:
    """The leaf stream of a thread: its rows get neighbouring leaves."""
    return ("thread", thread_id)


def checkpoint_binding(tenant_id: str, thread_id: str, ns: str, checkpoint_id: str, column: str) -> Binding:
    return Binding(tenant_id, CHECKPOINTS, json.dumps([thread_id, ns, checkpoint_id]), column)


def blob_binding(tenant_id: str, thread_id: str, ns: str, channel: str, version: str) -> Binding:
    return Binding(tenant_id, BLOBS, json.dumps([thread_id, ns, channel, version]), "blob")


def write_binding(tenant_id: str, thread_id: str, ns: str, checkpoint_id: str, task_id: str, idx: int) -> Binding:
    return Binding(tenant_id, WRITES, json.dumps([thread_id, ns, checkpoint_id, task_id, idx]), "blob")


# Sealed in place: the bytea columns hold a ciphertext on rows with a leaf, a legacy plaintext on the others.
_SEALED_ROWS = "leaf IS NOT NULL"

# What `lethe keys verify` checks of threads (app/keys/sealed.py): every row holding a ciphertext.
SEALED_COLUMNS = (
    SealedColumn(
        CHECKPOINTS, ("tenant_id", "thread_id", "checkpoint_ns", "checkpoint_id"), ("checkpoint", "metadata_sealed"),
        lambda row, column: checkpoint_binding(row["tenant_id"], row["thread_id"], row["checkpoint_ns"],
                                               row["checkpoint_id"], column.removesuffix("_sealed")),
        only=_SEALED_ROWS,
    ),
    SealedColumn(
        BLOBS, ("tenant_id", "thread_id", "checkpoint_ns", "channel", "version"), ("blob",),
        lambda row, _column: blob_binding(row["tenant_id"], row["thread_id"], row["checkpoint_ns"], row["channel"],
                                          row["version"]),
        only=_SEALED_ROWS,
    ),
    SealedColumn(
        WRITES, ("tenant_id", "thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"), ("blob",),
        lambda row, _column: write_binding(row["tenant_id"], row["thread_id"], row["checkpoint_ns"],
                                           row["checkpoint_id"], row["task_id"], row["idx"]),
        only=_SEALED_ROWS,
    ),
)


async def seal(sealer: Sealer, leaf: int, binding: Binding, data: bytes) -> bytes:
    return await sealer.seal_bytes(leaf, binding, data)


async def open_or_none(sealer: Sealer, leaf: int | None, binding: Binding, stored: bytes) -> bytes | None:
    """The plaintext of a stored column: as stored when the row is from before 0020 (no leaf), None when its leaf
    was shredded (the row reads as absent), `Tampered` when the bytes were moved or edited."""
    if leaf is None:
        return bytes(stored)
    try:
        return await sealer.open_bytes(binding, stored)
    except Erased:
        return None


async def open_metadata(sealer: Sealer, tenant_id: str, thread_id: str, row: Row) -> dict[str, Any] | None:
    """A checkpoint row's metadata (selected with checkpoint_ns, checkpoint_id, leaf, metadata, metadata_sealed)."""
    if row["leaf"] is None:
        return dict(row["metadata"])
    binding = checkpoint_binding(tenant_id, thread_id, row["checkpoint_ns"], row["checkpoint_id"], "metadata")
    opened = await open_or_none(sealer, row["leaf"], binding, row["metadata_sealed"])
    return None if opened is None else dict(json.loads(opened))


def dump_metadata(metadata: dict[str, Any]) -> bytes:
    """The metadata as the bytes sealed for it (JSON, as the jsonb column held it)."""
    return json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode()


def dump_versions(versions: dict[str, str]) -> str:
    return json.dumps(versions, separators=(",", ":"))


def run_id_of(metadata: dict[str, Any]) -> str | None:
    """The clear `run_id` column: what `metadata ->> 'run_id'` answers (a string as is, anything else as JSON)."""
    value = metadata.get("run_id")
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))


def contains(value: Any, pattern: Any) -> bool:
    """PostgreSQL's jsonb containment (`value @> pattern`), which the metadata filter meant when it ran in SQL:
    objects hold the pattern's members (recursively), arrays hold each of the pattern's elements somewhere, scalars
    are equal with their JSON type (true is not 1)."""
    if isinstance(pattern, dict):
        return isinstance(value, dict) and all(k in value and contains(value[k], v) for k, v in pattern.items())
    if isinstance(pattern, list):
        return isinstance(value, list) and all(any(contains(v, p) for v in value) for p in pattern)
    if isinstance(value, (dict, list)):
        return False
    if isinstance(pattern, bool) or isinstance(value, bool):
        return isinstance(pattern, bool) and isinstance(value, bool) and pattern == value
    if isinstance(pattern, (int, float)) and isinstance(value, (int, float)):
        return pattern == value
    return type(pattern) is type(value) and bool(pattern == value)
