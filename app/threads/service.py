"""LangGraph threads: the rules of docs/API.md "Threads (LangGraph checkpoints)".

A deleted thread stays deleted against late writers (langgraph#7206): a delete records the checkpoint ids it removed
(`thread_deleted_checkpoints`), and a put whose checkpoint or parent is among them, or writes for such a checkpoint,
are refused with 412 and store nothing, ordered by the thread's row lock (app/threads/repositories/). A put with no
parent starts a thread afresh, so a deleted thread's id can be used again for a new thread.

A rewrite of a thread's values (the client removes a message from every blob and write: LetheSaver.forget_message)
is one transaction under the same lock: refused when anything was written since the client read the values
(`revision`), and once done it bumps the thread's `generation`, so a writer whose base was read before the rewrite
(it still holds the message) is refused too.

Thread data is sealed at rest (docs/erasure-at-rest.md, the threads slice): the repositories seal what a route
stores before its transaction opens (the key provider down: 503 `keys-unavailable` with Retry-After, nothing written)
and open what it reads. Every route that removes or replaces stored rows (a delete, delete_for_runs, a prune, a
rewrite, a put replacing a checkpoint) records their leaves in its transaction and shreds them once it committed,
before it answers (app/threads/shredding.py); the provider down, the shred stays pending for the forget worker.

All SQL lives in `app.threads.repositories`; this module decides what a result means and raises typed errors.
"""

from __future__ import annotations

import base64
import binascii
import json

from app.db.database import Database
from app.db.statements import Sql
from app.errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge, PreconditionFailed
from app.keys.content import Sealer
from app.threads import shredding
from app.threads.repositories import checkpoints, locks, reads, removals, shreds
from app.threads.repositories.checkpoints import Blob, Stored
from app.threads.repositories.shreds import PendingShred
from app.threads.schemas import (
    BlobOut,
    CheckpointOut,
    CheckpointPage,
    CopyOut,
    DeletedOut,
    DeleteOut,
    PutCheckpoint,
    PutOut,
    PutWrites,
    PutWritesOut,
    RewriteIn,
    RewriteOut,
    StoredBlob,
    StoredWrite,
    ThreadValues,
    TypedOut,
    WriteOut,
)


class ThreadDeleted(PreconditionFailed):
    """A write on top of a checkpoint a delete removed: it would bring the deleted thread back."""

    type_slug = "thread-deleted"
    title = "The thread was deleted"


class ThreadRewritten(PreconditionFailed):
    """A write based on values read before a rewrite (forget_message) of the thread."""

    type_slug = "thread-rewritten"
    title = "The thread was rewritten since this write's base was read"


class ThreadChanged(PreconditionFailed):
    """A rewrite of values that changed since they were read."""

    type_slug = "thread-changed"
    title = "The thread changed since its values were read"


def _bytes(data: str, where: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{where}: data is not base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def encode_cursor(checkpoint_id: str, checkpoint_ns: str) -> str:
    raw = json.dumps([checkpoint_id, checkpoint_ns], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        checkpoint_id, checkpoint_ns = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise InvalidRequest("cursor is not one this API handed out") from None
    if not isinstance(checkpoint_id, str) or not isinstance(checkpoint_ns, str):
        raise InvalidRequest("cursor is not one this API handed out")
    return checkpoint_id, checkpoint_ns


def encode_tenant_cursor(checkpoint_id: str, thread_id: str, checkpoint_ns: str) -> str:
    raw = json.dumps([checkpoint_id, thread_id, checkpoint_ns], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_tenant_cursor(cursor: str) -> tuple[str, str, str]:
    try:
        checkpoint_id, thread_id, checkpoint_ns = json.loads(
            base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        )
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise InvalidRequest("cursor is not one this API handed out") from None
    if not all(isinstance(part, str) and "\x00" not in part for part in (checkpoint_id, thread_id, checkpoint_ns)):
        raise InvalidRequest("cursor is not one this API handed out")
    return checkpoint_id, thread_id, checkpoint_ns


def _out(thread_id: str, stored: Stored) -> CheckpointOut:
    return CheckpointOut(
        thread_id=thread_id, checkpoint_ns=stored.checkpoint_ns, checkpoint_id=stored.checkpoint_id,
        parent_id=stored.parent_id, checkpoint=TypedOut(type=stored.type, data=_b64(stored.checkpoint)),
        metadata=stored.metadata, generation=stored.generation,
        blobs=[BlobOut(channel=b.channel, version=b.version, type=b.type, data=_b64(b.data)) for b in stored.blobs],
        writes=[WriteOut(task_id=w.task_id, idx=w.idx, channel=w.channel, type=w.type, data=_b64(w.data),
                         task_path=w.task_path) for w in stored.writes],
    )


class ThreadService:
    def __init__(self, db: Database, sealer: Sealer, *, max_checkpoint_bytes: int) -> None:
        self.db = db
        self.sealer = sealer
        self.max_checkpoint_bytes = max_checkpoint_bytes

    async def _shred(self, pending: PendingShred | None) -> None:
        """After the commit, never before: a shred whose removal rolled back would erase live rows."""
        await shredding.settle(self.db, self.sealer, pending)

    def _check_size(self, size: int, what: str) -> None:
        if size > self.max_checkpoint_bytes:
            raise PayloadTooLarge(
                f"{what} holds {size} bytes, over LETHE_THREAD_MAX_CHECKPOINT_BYTES ({self.max_checkpoint_bytes})",
                limit=self.max_checkpoint_bytes,
            )

    @staticmethod
    async def _check_base(
        sql: Sql, tenant_id: str, thread_id: str, checkpoint_ns: str, based_on: str, generation: int, base: int | None,
    ) -> None:
        """Refuse a write built on `based_on` from values read before the thread's latest rewrite. `base` is the
        generation the writer read at (LetheSaver sends it); without it, the generation `based_on` was stored at."""
        if generation == 0:
            return
        if base is None:
            base = await checkpoints.stored_generation(sql, tenant_id, thread_id, checkpoint_ns, based_on)
            if base is None:
                return  # writes that reached the server before their checkpoint, from a writer naming no base
        if base < generation:
            raise ThreadRewritten(
                f"thread {thread_id!r} was rewritten (generation {generation}) after this write's base was read "
                f"(generation {base}): read it again", generation=generation,
            )

    async def put(self, tenant_id: str, thread_id: str, checkpoint_id: str, body: PutCheckpoint) -> PutOut:
        checkpoint = _bytes(body.checkpoint.data, "checkpoint")
        blobs = [Blob(b.channel, b.version, b.type, _bytes(b.data, f"blob {b.channel!r}")) for b in body.blobs]
        self._check_size(len(checkpoint) + sum(len(b.data) for b in blobs), "the checkpoint")
        sealed = await checkpoints.seal_put(
            self.sealer, tenant_id, thread_id, body.checkpoint_ns, checkpoint_id, checkpoint=checkpoint,
            metadata=body.metadata, blobs=blobs,
        )
        async with self.db.pg_transaction() as sql:
            locked = await locks.lock(sql, tenant_id, thread_id)
            if body.parent_id is not None:
                await self._check_base(sql, tenant_id, thread_id, body.checkpoint_ns, body.parent_id,
                                       locked.generation, body.generation)
            outcome = await checkpoints.put(
                sql, tenant_id, thread_id, body.checkpoint_ns, checkpoint_id, body.parent_id,
                type=body.checkpoint.type, sealed=sealed, channel_versions=body.channel_versions,
                generation=locked.generation,
            )
            retired = outcome.replaced
            if not outcome.stored:
                # Committed with the refusal: this checkpoint is dead too, so its writes never land either.
                retired = await checkpoints.bury(sql, tenant_id, thread_id, checkpoint_id)
            pending = await shreds.record(sql, tenant_id, retired)
        await self._shred(pending)
        if not outcome.stored:
            raise ThreadDeleted(
                f"thread {thread_id!r} was deleted: checkpoint {checkpoint_id!r} or its parent "
                f"{body.parent_id!r} is gone and nothing is written on top of it", thread_id=thread_id,
            )
        return PutOut(thread_id=thread_id, checkpoint_ns=body.checkpoint_ns, checkpoint_id=checkpoint_id,
                      generation=locked.generation)

    async def put_writes(self, tenant_id: str, thread_id: str, checkpoint_id: str, body: PutWrites) -> PutWritesOut:
        # The last of two writes with one index wins, as it would in LangGraph's savers (one statement cannot
        # touch a row twice).
        by_idx = {w.idx: (w.idx, w.channel, w.type, _bytes(w.data, f"write {w.idx}")) for w in body.writes}
        writes = list(by_idx.values())
        self._check_size(sum(len(w[3]) for w in writes), "the writes")
        sealed = await checkpoints.seal_writes(
            self.sealer, tenant_id, thread_id, body.checkpoint_ns, checkpoint_id, body.task_id, writes
        )
        async with self.db.pg_transaction() as sql:
            locked = await locks.lock(sql, tenant_id, thread_id)
            await self._check_base(sql, tenant_id, thread_id, body.checkpoint_ns, checkpoint_id, locked.generation,
                                   body.generation)
            outcome = await checkpoints.put_writes(
                sql, tenant_id, thread_id, body.checkpoint_ns, checkpoint_id, body.task_id, body.task_path, sealed
            )
            pending = await shreds.record(sql, tenant_id, outcome.replaced)
        await self._shred(pending)
        if not outcome.stored:
            raise ThreadDeleted(
                f"thread {thread_id!r} was deleted: checkpoint {checkpoint_id!r} is gone", thread_id=thread_id,
            )
        return PutWritesOut(stored=len(writes))

    async def get(self, tenant_id: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> CheckpointOut:
        async with self.db.pg() as sql:
            stored = await reads.one(sql, self.sealer, tenant_id, thread_id, checkpoint_ns, checkpoint_id)
        if stored is None:
            raise NotFound(f"no checkpoint {checkpoint_id!r} in thread {thread_id!r} (namespace {checkpoint_ns!r})")
        return _out(thread_id, stored)

    async def page(
        self, tenant_id: str, thread_id: str, *, checkpoint_ns: str | None, before: str | None, metadata: str | None,
        limit: int, cursor: str | None,
    ) -> CheckpointPage:
        filter_ = self._metadata_filter(metadata)
        after = decode_cursor(cursor) if cursor is not None else None
        async with self.db.pg() as sql:
            rows = await reads.page(sql, self.sealer, tenant_id, thread_id, checkpoint_ns=checkpoint_ns,
                                          before=before, after=after, metadata=filter_, limit=limit + 1,
                                          fill=limit)
        last = rows[limit - 1] if len(rows) > limit else None
        return CheckpointPage(
            checkpoints=[_out(thread_id, r) for r in rows[:limit]],
            next_cursor=encode_cursor(last.checkpoint_id, last.checkpoint_ns) if last else None,
        )

    async def tenant_page(
        self, tenant_id: str, *, checkpoint_ns: str | None, before: str | None, metadata: str | None, limit: int,
        cursor: str | None,
    ) -> CheckpointPage:
        """`page` across every thread of the tenant (LangGraph's `list(None)`): newest first, ties in thread order."""
        filter_ = self._metadata_filter(metadata)
        after = decode_tenant_cursor(cursor) if cursor is not None else None
        async with self.db.pg() as sql:
            rows = await reads.tenant_page(sql, self.sealer, tenant_id, checkpoint_ns=checkpoint_ns,
                                                 before=before, after=after, metadata=filter_, limit=limit + 1,
                                                 fill=limit)
        last = rows[limit - 1] if len(rows) > limit else None
        return CheckpointPage(
            checkpoints=[_out(thread_id, stored) for thread_id, stored in rows[:limit]],
            next_cursor=(encode_tenant_cursor(last[1].checkpoint_id, last[0], last[1].checkpoint_ns)
                         if last else None),
        )

    @staticmethod
    def _metadata_filter(metadata: str | None) -> dict[str, object]:
        if metadata is None:
            return {}
        try:
            value = json.loads(metadata)
        except ValueError:
            raise InvalidRequest("metadata: not JSON") from None
        if not isinstance(value, dict):
            raise InvalidRequest("metadata: a JSON object, each member a value the checkpoints' metadata holds")
        return value

    async def delete(self, tenant_id: str, thread_id: str) -> DeleteOut:
        async with self.db.pg_transaction(forget=True) as sql:
            if await locks.lock_existing(sql, tenant_id, thread_id) is None:
                raise NotFound(f"no thread {thread_id!r}")
            removed = await removals.delete(sql, tenant_id, [thread_id])
            pending = await shreds.record(sql, tenant_id, removed.leaves)
        await self._shred(pending)
        return DeleteOut(thread_id=thread_id, deleted_checkpoints=removed.checkpoints)

    async def delete_for_runs(self, tenant_id: str, run_ids: list[str]) -> DeletedOut:
        if not run_ids:
            return DeletedOut(deleted_checkpoints=0)
        async with self.db.pg_transaction(forget=True) as sql:
            threads = await removals.threads_of_runs(sql, tenant_id, run_ids)
            locked = await locks.lock_many(sql, tenant_id, threads)
            removed = await removals.delete_runs(sql, tenant_id, locked, run_ids) if locked else removals.NOTHING
            pending = await shreds.record(sql, tenant_id, removed.leaves)
        await self._shred(pending)
        return DeletedOut(deleted_checkpoints=removed.checkpoints)

    async def prune(self, tenant_id: str, thread_ids: list[str], strategy: str) -> DeletedOut:
        if not thread_ids:
            return DeletedOut(deleted_checkpoints=0)
        async with self.db.pg_transaction(forget=True) as sql:
            locked = await locks.lock_many(sql, tenant_id, sorted(set(thread_ids)))
            if not locked:
                removed = removals.NOTHING
            elif strategy == "delete":
                removed = await removals.delete(sql, tenant_id, locked)
            else:
                removed = await removals.delete_all_but_latest(sql, tenant_id, locked)
            pending = await shreds.record(sql, tenant_id, removed.leaves)
        await self._shred(pending)
        return DeletedOut(deleted_checkpoints=removed.checkpoints)

    async def copy(self, tenant_id: str, thread_id: str, target_id: str) -> CopyOut:
        if target_id == thread_id:
            # Well-formed, but it names a state that cannot be: every checkpoint would already be in the target.
            raise Conflict("target_thread_id is the thread itself: a thread cannot be copied onto itself")
        async with self.db.pg_transaction() as sql:
            # Both rows locked in id order (see repository `lock_many`); the target's is created if new.
            for locking in sorted([thread_id, target_id]):
                await locks.lock(sql, tenant_id, locking)
            if not await removals.has_checkpoints(sql, tenant_id, thread_id):
                raise NotFound(f"no thread {thread_id!r}")
            copied = await removals.copy(sql, self.sealer, tenant_id, thread_id, target_id)
        if copied is None:
            raise ThreadDeleted(
                f"thread {target_id!r} had checkpoints of {thread_id!r} deleted from it: they are not stored again",
                thread_id=target_id,
            )
        return CopyOut(thread_id=thread_id, target_thread_id=target_id, copied_checkpoints=copied)

    async def values(self, tenant_id: str, thread_id: str) -> ThreadValues:
        async with self.db.pg() as sql:
            # The revision first: anything written after it was read moves it, and the rewrite is refused.
            state = await locks.state(sql, tenant_id, thread_id)
            if state is None:
                raise NotFound(f"no thread {thread_id!r}")
            blobs = await removals.all_blobs(sql, self.sealer, tenant_id, thread_id)
            writes = await removals.all_writes(sql, self.sealer, tenant_id, thread_id)
        return ThreadValues(
            thread_id=thread_id, revision=state.revision, generation=state.generation,
            blobs=[StoredBlob(checkpoint_ns=b["checkpoint_ns"], channel=b["channel"], version=b["version"],
                              type=b["type"], data=_b64(b["blob"])) for b in blobs],
            writes=[StoredWrite(checkpoint_ns=w["checkpoint_ns"], checkpoint_id=w["checkpoint_id"],
                                task_id=w["task_id"], idx=w["idx"], channel=w["channel"], type=w["type"],
                                data=_b64(w["blob"]), task_path=w["task_path"]) for w in writes],
        )

    async def rewrite(self, tenant_id: str, thread_id: str, body: RewriteIn) -> RewriteOut:
        blobs = [(b.checkpoint_ns, b.channel, b.version, b.type, _bytes(b.data, f"blob {b.channel!r}"))
                 for b in body.blobs]
        writes = [(w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx, w.type, _bytes(w.data, f"write {w.task_id!r}"))
                  for w in body.writes]
        dropped = [(w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx) for w in body.drop_writes]
        sealed_blobs, sealed_writes = await removals.seal_rewrite(
            self.sealer, tenant_id, thread_id, blobs=blobs, writes=writes
        )
        async with self.db.pg_transaction(forget=True) as sql:
            locked = await locks.lock_existing(sql, tenant_id, thread_id)
            if locked is None:
                raise NotFound(f"no thread {thread_id!r}")
            if locked.revision - 1 != body.revision:  # the lock bumped it
                raise ThreadChanged(
                    f"thread {thread_id!r} changed since revision {body.revision} was read: read its values again",
                    revision=locked.revision - 1,
                )
            generation, retired = await removals.replace(
                sql, tenant_id, thread_id, blobs=sealed_blobs, writes=sealed_writes, dropped=dropped
            )
            pending = await shreds.record(sql, tenant_id, retired)
        # What the rewrite took out (the forgotten message in the replaced values) stops opening in every copy.
        await self._shred(pending)
        return RewriteOut(thread_id=thread_id, revision=locked.revision, generation=generation)
