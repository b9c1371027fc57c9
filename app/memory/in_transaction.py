"""Memory operations inside another domain's transaction: a forget job tombstoning a record derived from what it
forgets (atomically with the session it rebuilt), a new session reading what it injects, a session writing its
summary. `MemoryService` runs the same tombstone in a transaction of its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.statements import InSession, Sql
from app.errors import Conflict
from app.keys.content import Sealer
from app.memory.cascade import ForgetCascade
from app.memory.repositories import records as repo
from app.memory.repositories.records import Injectable, Written

_TOMBSTONE_RETRIES = 8


@dataclass(frozen=True)
class ForgetOutcome:
    version: int
    forget_id: str | None
    already_forgotten: bool
    leaves: list[int] = field(default_factory=list)  # to shred once the tombstone committed


async def forget_in(
    sql: Sql, cascade: ForgetCascade, tenant_id: str, namespace: str, key: str, *, source: str
) -> tuple[ForgetOutcome, int]:
    """Tombstone a key in the caller's transaction (and queue its cascade there); (outcome, history rows erased).
    A forget job that finds a record derived from what it forgets tombstones it this way, atomically with the
    session it rebuilt. Once the transaction committed, the caller shreds `outcome.leaves` (`cascade.shred`)."""
    for _ in range(_TOMBSTONE_RETRIES):
        tomb = await repo.tombstone(sql, tenant_id, namespace, key, source=source)
        if tomb is not None:
            erased = await repo.erase_history(sql, tenant_id, namespace, key, tombstone=tomb, source=source)
            # The cascade seam: the forget job for every session this record was injected into, and its shred.
            forget_id = await cascade.enqueue(
                sql, tenant_id=tenant_id, namespace=namespace, key=key, tombstone_version=tomb.version, erased=erased
            )
            outcome = ForgetOutcome(
                version=tomb.version, forget_id=forget_id, already_forgotten=False, leaves=erased.leaves
            )
            return outcome, erased.rows
        state = await repo.locked_state(sql, tenant_id, namespace, key)
        if state is not None and state.forgotten:
            # Idempotent: the same tombstone answers again. Its job (if any) was enqueued the first time.
            return ForgetOutcome(version=state.version, forget_id=None, already_forgotten=True), 0
        # Re-established between the two statements: tombstone the new version.
    # pragma: no cover - needs a writer re-establishing the key faster than we can lock it, 8 times
    raise Conflict("the key kept changing while it was being forgotten; retry")


async def injectable_in(
    session: AsyncSession, sealer: Sealer, tenant_id: str, namespace: str, *, limit: int
) -> list[Injectable]:
    """The live records a new session injects, read in its creating transaction under a share lock: a concurrent
    forget of one either waits for the session (and its cascade then replays it) or lands first (and the record is
    not injected). A record whose leaf was shredded is not injected."""
    return await repo.injectable(InSession(session), sealer, tenant_id, namespace, limit=limit)


async def write_summary_in(
    session: AsyncSession, sealer: Sealer, tenant_id: str, namespace: str, key: str, value: Any,
    provenance: dict[str, str],
) -> Written:
    """A session's summary written into memory (source `summarizer`) with where it came from, in the caller's
    transaction. Based on the head read under a share lock, so it supersedes whatever is there, a tombstone included:
    the summary is new information derived now, not a stale write in flight (and a forget of what it was derived
    from tombstones it in turn)."""
    sql = InSession(session)
    state = await repo.locked_state(sql, tenant_id, namespace, key)
    if state is None:
        written = await repo.create_if_absent(
            sql, sealer, tenant_id, namespace, key, value=value, source="summarizer", provenance=provenance
        )
    else:
        written = await repo.write_if_version(
            sql, sealer, tenant_id, namespace, key, base=state.version, value=value, source="summarizer",
            provenance=provenance,
        )
    assert written is not None  # the share lock keeps the head where it was read
    return written
