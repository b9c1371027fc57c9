"""Data subjects: what is linked to a person, and the access request's export (GDPR Art. 15 and 20).

A subject is the caller's id for a person. Sessions name it at creation (native `subject_id`, an OpenAI
conversation's `metadata.lethe_subject_id`), memory namespaces are linked with PUT. The export walks all of it a page
at a time, each page in a short transaction of its own, and streams one JSON document: what is live now, opened
from its ciphertext; nothing erased (a shredded artifact or value is not held any more, so it is not exported);
past forgets as ids and counts, never their targets or reasons (they can quote what was forgotten).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from app.db.consistency import PRIMARY, ReadFrom
from app.db.database import Database
from app.db.statements import InSession
from app.errors import NotFound
from app.forget.listing import page_jobs
from app.forget.schemas import job_out
from app.holds import repository as holds_repo
from app.keys.content import Sealer
from app.subjects import repository as repo
from app.subjects.schemas import MAX_LISTED, SubjectOut

PAGE = 200  # rows per read: what the export holds at once


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_when)


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON: {type(value).__name__}")


class SubjectService:
    def __init__(self, db: Database, sealer: Sealer) -> None:
        self.db = db
        self.sealer = sealer

    async def put(self, tenant_id: str, subject_id: str, namespaces: list[str]) -> tuple[SubjectOut, bool]:
        """Link exactly `namespaces` (deduplicated, in order); whether the subject was made now."""
        async with self.db.transaction() as tx:
            made = await repo.put_namespaces(tx, tenant_id, subject_id, list(dict.fromkeys(namespaces)))
        return await self.get(tenant_id, subject_id), made

    async def get(self, tenant_id: str, subject_id: str, *, where: ReadFrom = PRIMARY) -> SubjectOut:
        async def read(tx: Any) -> SubjectOut | None:
            row = await repo.get(tx, tenant_id, subject_id)
            if row is None:
                return None
            linked = await repo.sessions_after(tx, tenant_id, subject_id, "", MAX_LISTED)
            return SubjectOut(
                id=row.id, memory_namespaces=list(row.memory_namespaces),
                sessions=await repo.session_count(tx, tenant_id, subject_id),
                session_ids=[s.id for s in linked],
                conversation_ids=[s.conversation_id for s in linked if s.conversation_id is not None],
                created_at=row.created_at, erased_at=row.erased_at, erase_forget_id=row.erase_forget_id,
                holds=await holds_repo.standing_over_subject(InSession(tx), tenant_id, subject_id,
                                                             list(row.memory_namespaces), MAX_LISTED),
            )

        found = await self.db.read(where, read)
        if found is None:
            raise NotFound(f"no subject {subject_id!r}")
        return found

    async def export(self, tenant_id: str, subject_id: str) -> AsyncIterator[bytes]:
        """The subject's export, checked to exist before the first byte (a 404 cannot follow a 200)."""
        subject = await self.get(tenant_id, subject_id)
        return self._document(tenant_id, subject)

    async def _document(self, tenant_id: str, subject: SubjectOut) -> AsyncIterator[bytes]:
        head = {"id": subject.id, "memory_namespaces": subject.memory_namespaces, "created_at": subject.created_at,
                "erased_at": subject.erased_at, "erase_forget_id": subject.erase_forget_id}
        yield f'{{"exported_at":{_dumps(datetime.now(UTC))},"subject":{_dumps(head)},"sessions":['.encode()
        session_ids: list[str] = []  # ids only: what the receipts below are looked up by
        async for chunk in self._sessions(tenant_id, subject.id, session_ids):
            yield chunk.encode()
        yield b'],"memory":['
        first = True
        for namespace in subject.memory_namespaces:
            async for value in self._memory(tenant_id, namespace):
                yield (value if first else "," + value).encode()
                first = False
        yield b'],"forget_receipts":['
        first = True
        async for receipt in self._receipts(tenant_id, session_ids):
            yield (receipt if first else "," + receipt).encode()
            first = False
        yield b"]}"

    async def _sessions(self, tenant_id: str, subject_id: str, seen: list[str]) -> AsyncIterator[str]:
        """The sessions' array elements, separators included: each opens, streams its artifacts, and closes."""
        after = ""
        while True:
            async with self.db.transaction() as tx:
                page = await repo.sessions_after(tx, tenant_id, subject_id, after, PAGE)
            for session in page:
                head = {"id": session.id, "created_at": session.created_at, "turns": session.turns,
                        "conversation_id": session.conversation_id}
                yield ("," if seen else "") + _dumps(head)[:-1] + ',"artifacts":['  # its artifacts follow
                seen.append(session.id)
                first = True
                async for artifact in self._artifacts(tenant_id, session.id):
                    yield artifact if first else "," + artifact
                    first = False
                yield "]}"
            if len(page) < PAGE:
                return
            after = page[-1].id

    async def _artifacts(self, tenant_id: str, session_id: str) -> AsyncIterator[str]:
        after = -1
        while True:
            async with self.db.transaction() as tx:
                page = await repo.artifacts_after(tx, self.sealer, tenant_id, session_id, after, PAGE)
            for row in page:
                if not row.erased:
                    yield _dumps({"id": row.id, "kind": row.kind, "turn": row.turn, "content": row.content})
            if len(page) < PAGE:
                return
            after = page[-1].position

    async def _memory(self, tenant_id: str, namespace: str) -> AsyncIterator[str]:
        after: str | None = ""
        while after is not None:
            async with self.db.transaction() as tx:
                page, after = await repo.memory_after(tx, self.sealer, tenant_id, namespace, after, PAGE)
            for held in page:
                yield _dumps({"namespace": namespace, "key": held.key, "version": held.version, "value": held.value,
                              "updated_at": held.updated_at})

    async def _receipts(self, tenant_id: str, session_ids: list[str]) -> AsyncIterator[str]:
        """Past forgets that reached the subject's sessions: ids, kinds and counts (each once)."""
        told: set[str] = set()
        for session_id in session_ids:
            cursor: str | None = None
            while True:
                views, cursor = await page_jobs(
                    self.db, self.sealer, tenant_id, cursor=cursor, limit=100, status=None, session_id=session_id
                )
                for view in views:
                    if view.id in told:
                        continue
                    told.add(view.id)
                    yield _dumps(_receipt(job_out(view).model_dump(mode="json")))
                if cursor is None:
                    break


def _receipt(job: dict[str, Any]) -> dict[str, Any]:
    """A forget as the export tells it: what kind, when, how much, never what (no target, no reason)."""
    return {
        "id": job["id"], "status": job["status"], "strategy": job["strategy"],
        "created_at": job["created_at"], "finished_at": job["finished_at"],
        "sessions": [{"session_id": s["session_id"], "artifacts_erased": len(s.get("closure") or []),
                      "transitions_replayed": s.get("transitions_replayed", 0)} for s in job.get("sessions") or []],
        "memory": None if not job.get("memory") else {k: job["memory"][k] for k in ("namespace", "key")},
        "erasure": job.get("erasure"),
    }
