"""The check every erasure makes inside its own transaction: a standing legal hold over what it erases refuses it
(409 `legal_hold`, naming the hold). Lethe's own housekeeping (a session opened for one request and dropped) is not
an erasure and is not checked. A plan (a dry run) asks the same questions without the locks."""

from __future__ import annotations

from app.db.statements import Sql
from app.errors import LegalHold
from app.holds import repository as repo


async def session_hold(sql: Sql, tenant_id: str, session_id: str, *, lock: bool = True) -> repo.Standing | None:
    """A hold on the session, or on the subject it names."""
    subject = await repo.session_subject(sql, tenant_id, session_id)
    return await repo.covering(sql, tenant_id, sessions=[session_id], subjects=[subject] if subject else [], lock=lock)


async def namespace_hold(sql: Sql, tenant_id: str, namespace: str, *, lock: bool = True) -> repo.Standing | None:
    """A hold on the namespace, or on a subject it is linked to."""
    subjects = await repo.linking(sql, tenant_id, namespace)
    return await repo.covering(sql, tenant_id, namespaces=[namespace], subjects=subjects, lock=lock)


async def refuse_session(sql: Sql, tenant_id: str, session_id: str) -> None:
    held = await session_hold(sql, tenant_id, session_id)
    if held is not None:
        raise LegalHold(held.id, f"session {session_id!r}")


async def refuse_namespace(sql: Sql, tenant_id: str, namespace: str) -> None:
    held = await namespace_hold(sql, tenant_id, namespace)
    if held is not None:
        raise LegalHold(held.id, f"memory namespace {namespace!r}")


async def refuse_subject(sql: Sql, tenant_id: str, subject_id: str, *, lock: bool = True) -> None:
    """A hold on the subject itself (a hold on one of their sessions or namespaces holds only that part)."""
    held = await repo.covering(sql, tenant_id, subjects=[subject_id], lock=lock)
    if held is not None:
        raise LegalHold(held.id, f"subject {subject_id!r}")
