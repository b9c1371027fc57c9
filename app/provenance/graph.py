"""Provenance queries: the taint closure of an artifact and the first entry τ of a source (Algorithm 1, lines 2-3).

The graph lives in `provenance_edges` (parent was in the context of the model call that produced child), stored as
the transitive reduction of the full-context dependencies (app/runtime/provenance.py): reachability over the stored
edges equals reachability over "every prefix artifact → every later model output". The closure is one recursive
CTE in PostgreSQL, scoped to the session, so it never leaves the database and never crosses a tenant.

Closure semantics: I(a) = {a} + {b : a reaches b}. The artifact itself is in its closure, as the forgotten source is in
the set a forget invalidates.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact
from app.db.repositories import artifacts as repo


async def taint_closure(db: AsyncSession, tenant_id: str, session_id: str, artifact_id: str) -> list[Artifact]:
    """The artifact and every artifact whose context reached it, in log order; empty when it is unknown."""
    return await repo.closure(db, tenant_id, session_id, artifact_id)


async def first_entry(db: AsyncSession, tenant_id: str, session_id: str, source_ids: Sequence[str]) -> int | None:
    """τ: the turn of the earliest artifact carrying any of the sources (None when none of them is in the session).
    Observations carry their own id as their source, so for an observation this is its own turn."""
    if not source_ids:
        return None
    return await repo.first_entry(db, tenant_id, session_id, source_ids)
