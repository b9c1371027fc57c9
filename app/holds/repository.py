"""Legal holds' SQL. Every statement is a `Statement`, so a guard runs inside whichever transaction erases (an ORM
unit of work deleting a session, the memory API's asyncpg transaction tombstoning a key).

Ordering against a hold placed concurrently: an erasure takes a shared transaction-level advisory lock on each scope
it erases (the session, its subject; the namespace, the subjects linking it) before it looks for a standing hold, and
placing a hold takes the exclusive lock on its scope before it checks the object and inserts. So either the
erasure's transaction committed before the hold was placed (the hold then finds a session gone: 404), or the
erasure sees the hold (409). Nothing is erased under a hold that was placed before the erasure looked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db.statements import Sql, Statement

_SHARED = Statement(
    "SELECT pg_advisory_xact_lock_shared(hashtextextended(s, 0)) FROM unnest(CAST(:scopes AS text[])) AS s"
)
_EXCLUSIVE = Statement("SELECT pg_advisory_xact_lock(hashtextextended(:scope, 0))")
_SESSION_SUBJECT = Statement("SELECT subject_id FROM sessions WHERE tenant_id = :tenant_id AND id = :session_id")
_LINKING = Statement(
    "SELECT id FROM subjects WHERE tenant_id = :tenant_id "
    "AND memory_namespaces @> ARRAY[CAST(:namespace AS varchar)] ORDER BY id"
)
_STANDING = Statement("""
    SELECT id, subject_id, session_id, namespace FROM holds
    WHERE tenant_id = :tenant_id AND released_at IS NULL
      AND (session_id = ANY(CAST(:sessions AS text[])) OR subject_id = ANY(CAST(:subjects AS text[]))
           OR namespace = ANY(CAST(:namespaces AS text[])))
    ORDER BY id LIMIT 1
""")
_INSERT = Statement("""
    INSERT INTO holds (tenant_id, id, subject_id, session_id, namespace, reason, created_by)
    VALUES (:tenant_id, :id, :subject_id, :session_id, :namespace, :reason, :key_id)
""")
_EVENT = Statement(
    "INSERT INTO hold_events (tenant_id, hold_id, action, key_id, detail) "
    "VALUES (:tenant_id, :hold_id, :action, :key_id, :detail)",
    json=("detail",),
)
_GET = Statement("""
    SELECT id, subject_id, session_id, namespace, reason, created_at, created_by, released_at, released_by
    FROM holds WHERE tenant_id = :tenant_id AND id = :id
""")
_LOCK_ROW = Statement(_GET.sql + " FOR UPDATE")
_RELEASE = Statement(
    "UPDATE holds SET released_at = now(), released_by = :key_id WHERE tenant_id = :tenant_id AND id = :id"
)
_EVENTS = Statement(
    "SELECT action, key_id, at, detail FROM hold_events WHERE tenant_id = :tenant_id AND hold_id = :hold_id "
    "ORDER BY id",
    json=("detail",),
)
_DEFER = Statement(
    "INSERT INTO hold_deferrals (tenant_id, hold_id, subject_id) VALUES (:tenant_id, :hold_id, :subject_id) "
    "ON CONFLICT DO NOTHING"
)
_DEFERRED = Statement(
    "SELECT subject_id FROM hold_deferrals WHERE tenant_id = :tenant_id AND hold_id = :hold_id ORDER BY subject_id"
)
_UNDEFER = Statement(
    "DELETE FROM hold_deferrals WHERE tenant_id = :tenant_id AND hold_id = :hold_id AND subject_id = :subject_id"
)
_MOVE = Statement(
    "UPDATE holds SET session_id = :to_session WHERE tenant_id = :tenant_id AND session_id = :from_session "
    "AND released_at IS NULL"
)


@dataclass(frozen=True)
class Standing:
    """A standing hold and the one scope it covers."""

    id: str
    subject_id: str | None
    session_id: str | None
    namespace: str | None

    @property
    def scope(self) -> dict[str, str]:
        if self.session_id is not None:
            return {"session_id": self.session_id}
        if self.namespace is not None:
            return {"namespace": self.namespace}
        assert self.subject_id is not None
        return {"subject_id": self.subject_id}


@dataclass(frozen=True)
class HoldRow:
    id: str
    subject_id: str | None
    session_id: str | None
    namespace: str | None
    reason: str
    created_at: datetime
    created_by: str | None
    released_at: datetime | None
    released_by: str | None


def scope_key(tenant_id: str, kind: str, value: str) -> str:
    """The advisory lock's name for one scope (hashed to 64 bits: a collision only makes two erasures wait)."""
    return f"hold:{tenant_id}:{kind}:{value}"


async def covering(
    sql: Sql, tenant_id: str, *, sessions: Sequence[str] = (), subjects: Sequence[str] = (),
    namespaces: Sequence[str] = (), lock: bool = True,
) -> Standing | None:
    """The standing hold covering any of these, if one does. With `lock` (an erasure about to act, in its own
    transaction), the scopes' shared locks are taken first: a hold being placed on them waits for this transaction."""
    if lock:
        scopes = sorted({scope_key(tenant_id, "session", s) for s in sessions}
                        | {scope_key(tenant_id, "subject", s) for s in subjects}
                        | {scope_key(tenant_id, "namespace", n) for n in namespaces})
        await sql.all(_SHARED, {"scopes": scopes})
    row = await sql.one(_STANDING, {"tenant_id": tenant_id, "sessions": list(sessions), "subjects": list(subjects),
                                    "namespaces": list(namespaces)})
    return None if row is None else Standing(row["id"], row["subject_id"], row["session_id"], row["namespace"])


async def session_subject(sql: Sql, tenant_id: str, session_id: str) -> str | None:
    row = await sql.one(_SESSION_SUBJECT, {"tenant_id": tenant_id, "session_id": session_id})
    return None if row is None else row["subject_id"]


async def linking(sql: Sql, tenant_id: str, namespace: str) -> list[str]:
    """The subjects a namespace is linked to."""
    return [r["id"] for r in await sql.all(_LINKING, {"tenant_id": tenant_id, "namespace": namespace})]


async def lock_scope(sql: Sql, tenant_id: str, kind: str, value: str) -> None:
    """The exclusive lock a hold's placement takes: erasures of the scope in flight commit first."""
    await sql.all(_EXCLUSIVE, {"scope": scope_key(tenant_id, kind, value)})


async def insert(sql: Sql, tenant_id: str, hold_id: str, scope: dict[str, str], reason: str,
                 key_id: str | None) -> None:
    await sql.rowcount(_INSERT, {"tenant_id": tenant_id, "id": hold_id, "subject_id": scope.get("subject_id"),
                                 "session_id": scope.get("session_id"), "namespace": scope.get("namespace"),
                                 "reason": reason, "key_id": key_id})


async def event(sql: Sql, tenant_id: str, hold_id: str, action: str, key_id: str | None,
                detail: dict[str, Any] | None = None) -> None:
    await sql.rowcount(_EVENT, {"tenant_id": tenant_id, "hold_id": hold_id, "action": action, "key_id": key_id,
                                "detail": detail or {}})


async def get(sql: Sql, tenant_id: str, hold_id: str, *, for_update: bool = False) -> HoldRow | None:
    row = await sql.one(_LOCK_ROW if for_update else _GET, {"tenant_id": tenant_id, "id": hold_id})
    return None if row is None else HoldRow(**{name: row[name] for name in HoldRow.__dataclass_fields__})


async def release(sql: Sql, tenant_id: str, hold_id: str, key_id: str | None) -> None:
    await sql.rowcount(_RELEASE, {"tenant_id": tenant_id, "id": hold_id, "key_id": key_id})


async def events(sql: Sql, tenant_id: str, hold_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await sql.all(_EVENTS, {"tenant_id": tenant_id, "hold_id": hold_id})]


async def defer(sql: Sql, tenant_id: str, hold_id: str, subject_id: str) -> None:
    await sql.rowcount(_DEFER, {"tenant_id": tenant_id, "hold_id": hold_id, "subject_id": subject_id})


async def deferred(sql: Sql, tenant_id: str, hold_id: str) -> list[str]:
    return [r["subject_id"] for r in await sql.all(_DEFERRED, {"tenant_id": tenant_id, "hold_id": hold_id})]


async def undefer(sql: Sql, tenant_id: str, hold_id: str, subject_id: str) -> None:
    await sql.rowcount(_UNDEFER, {"tenant_id": tenant_id, "hold_id": hold_id, "subject_id": subject_id})


async def move_session(sql: Sql, tenant_id: str, from_session: str, to_session: str) -> None:
    """A conversation moved onto another session (reconfigured, or adopted by a matching one): its holds follow."""
    await sql.rowcount(_MOVE, {"tenant_id": tenant_id, "from_session": from_session, "to_session": to_session})


_SESSION = Statement("SELECT 1 AS found FROM sessions WHERE tenant_id = :tenant_id AND id = :session_id")


async def session_exists(sql: Sql, tenant_id: str, session_id: str) -> bool:
    return await sql.one(_SESSION, {"tenant_id": tenant_id, "session_id": session_id}) is not None


_OF_SUBJECT = Statement("""
    SELECT id, subject_id, session_id, namespace, reason, created_at FROM holds
    WHERE tenant_id = :tenant_id AND released_at IS NULL
      AND (subject_id = :subject_id OR namespace = ANY(CAST(:namespaces AS text[]))
           OR session_id IN (SELECT id FROM sessions WHERE tenant_id = :tenant_id AND subject_id = :subject_id))
    ORDER BY id LIMIT :limit
""")


async def standing_over_subject(
    sql: Sql, tenant_id: str, subject_id: str, namespaces: list[str], limit: int
) -> list[dict[str, Any]]:
    """The standing holds over a subject or a part of theirs (a session, a linked namespace), oldest first."""
    rows = await sql.all(_OF_SUBJECT, {"tenant_id": tenant_id, "subject_id": subject_id, "namespaces": namespaces,
                                       "limit": limit})
    return [{k: v for k, v in dict(r).items() if v is not None} for r in rows]
