"""The check every erasure makes inside its own transaction: a standing legal hold over what it erases refuses it
(409 `legal_hold`, naming the hold). Lethe's own housekeeping (a session opened for one request and dropped) is not
an erasure and is not checked."""

from __future__ import annotations

from app.db.statements import Sql
from app.errors import LegalHold
from app.holds import repository as repo


async def refuse_session(sql: Sql, tenant_id: str, session_id: str) -> None:
    """A hold on the session, or on the subject it names."""
    subject = await repo.session_subject(sql, tenant_id, session_id)
    held = await repo.covering(sql, tenant_id, sessions=[session_id], subjects=[subject] if subject else [])
    if held is not None:
        raise LegalHold(held.id, f"session {session_id!r}")


async def refuse_namespace(sql: Sql, tenant_id: str, namespace: str) -> None:
    """A hold on the namespace, or on a subject it is linked to."""
    subjects = await repo.linking(sql, tenant_id, namespace)
    held = await repo.covering(sql, tenant_id, namespaces=[namespace], subjects=subjects)
    if held is not None:
        raise LegalHold(held.id, f"memory namespace {namespace!r}")


async def refuse_subject(sql: Sql, tenant_id: str, subject_id: str) -> None:
    """A hold on the subject itself (a hold on one of their sessions or namespaces holds only that part)."""
    held = await repo.covering(sql, tenant_id, subjects=[subject_id])
    if held is not None:
        raise LegalHold(held.id, f"subject {subject_id!r}")
