"""Shredding what the thread routes removed: the leaves of a removal, punctured once its transaction committed.

A route that removed or replaced sealed rows recorded their leaves in its transaction (repositories/shreds.py); it
calls `settle` right after the commit, before it answers, so a deleted thread's ciphertexts stop opening in every copy
of the database by the time the client hears it was deleted. With the key provider down the removal still answers
(it committed) and the record stays, loud in the log, for the forget worker's sweep (app/forget/shredding.py) to
retry: shredding is idempotent.
"""

from __future__ import annotations

import logging

from app.db.database import Database
from app.keys.content import Sealer
from app.keys.errors import Unavailable
from app.threads.repositories import shreds
from app.threads.repositories.shreds import PendingShred

log = logging.getLogger(__name__)


async def settle(db: Database, sealer: Sealer, pending: PendingShred | None) -> bool:
    """Puncture the recorded leaves and drop the record; False when it stays pending (the provider refused)."""
    if pending is None:
        return True
    try:
        await sealer.shred(pending.tenant_id, pending.leaves)
    except Unavailable as exc:
        log.warning("thread shred pending: key provider unavailable",
                    extra={"thread_shred": pending.id, "leaves": len(pending.leaves), "error": str(exc)})
        return False
    except Exception:
        # The removal committed: its answer must not be an error. A damaged cover stays loud here and in the sweep.
        log.exception("thread shred pending: it failed", extra={"thread_shred": pending.id})
        return False
    async with db.pg() as sql:
        await shreds.done(sql, pending.id)
    return True


async def sweep(db: Database, sealer: Sealer, *, limit: int) -> int:
    """Settle up to `limit` pending thread shreds, oldest first; how many completed."""
    async with db.pg() as sql:
        waiting = await shreds.pending(sql, limit=limit)
    done = 0
    for pending in waiting:
        done += await settle(db, sealer, pending)
    return done
