"""SQL for artifacts and their provenance edges. Callers have checked the session's tenant; queries that a client's
id reaches (an artifact id) filter on the tenant again, so a foreign id reads as unknown whatever the caller did."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import String, delete, func, insert, literal, select, update
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact, ProvenanceEdge
from app.db.statements import InSession, Sql, Statement
from app.keys.content import Sealer
from app.keys.errors import Erased
from app.sessions.repositories.sealing import (
    open_artifacts,
    open_tokens,
    seal_content,
    seal_meta,
    seal_rows,
    seal_vector,
)


@dataclass(frozen=True)
class LogEntry:
    """What a transition needs of a stored artifact: its tokens, provenance and the chunk recipe it carries."""

    id: str
    kind: str
    turn: int
    position: int
    token_start: int
    token_end: int
    token_ids: list[int]
    source_ids: list[str]
    chunks: Any  # {"at": offset, "sizes": [...]} on the last artifact of a transition the engine reported; else None


class ErasedLog(Exception):
    """The live log holds an artifact whose keys a forget shredded: the database was restored from a backup taken
    before that forget. Everything from transition `turn` on is unreadable as a whole (a forget erases a suffix, or
    the target and its closure), so the session resumes before it (app/sessions/commit.py)."""

    def __init__(self, turn: int) -> None:
        super().__init__(f"the session's transition {turn} was erased")
        self.turn = turn


async def load_log(db: AsyncSession, sealer: Sealer, session_id: str) -> list[LogEntry]:
    """The live log, token ids opened; `ErasedLog` at the first artifact a forget shredded."""
    stmt = (
        select(
            Artifact.id,
            Artifact.kind,
            Artifact.turn,
            Artifact.position,
            Artifact.token_start,
            Artifact.token_end,
            Artifact.source_ids,
            Artifact.meta["chunks"],
            Artifact.tenant_id,
            Artifact.token_ids,
            Artifact.token_ids_sealed,
        )
        .where(Artifact.session_id == session_id, Artifact.archived_by.is_(None))
        .order_by(Artifact.position)
    )
    log: list[LogEntry] = []
    for r in (await db.execute(stmt)).all():
        try:
            tokens = await open_tokens(sealer, r.tenant_id, r.id, r.token_ids, r.token_ids_sealed)
        except Erased:
            raise ErasedLog(r.turn) from None  # rows come in log order: this is the first erased transition
        log.append(LogEntry(r.id, r.kind, r.turn, r.position, r.token_start, r.token_end, tokens, r.source_ids, r[8]))
    return log


async def token_end(db: AsyncSession, session_id: str) -> int:
    """Where the live log ends: the session's token count."""
    stmt = select(func.coalesce(func.max(Artifact.token_end), 0)).where(
        Artifact.session_id == session_id, Artifact.archived_by.is_(None)
    )
    return int((await db.execute(stmt)).scalar_one())


async def insert_artifacts(db: AsyncSession, sealer: Sealer, rows: Sequence[dict[str, Any]]) -> None:
    """New artifacts (rows as app/runtime/records.py makes them, an `embedding` optional), stored sealed."""
    if rows:
        await db.execute(insert(Artifact), await seal_rows(sealer, rows))


async def insert_edges(db: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        await db.execute(insert(ProvenanceEdge), list(rows))


async def list_live(db: AsyncSession, sealer: Sealer, tenant_id: str, session_id: str) -> list[Artifact]:
    """The live prompt's artifacts in log order (not those a compaction archived)."""
    stmt = (
        select(Artifact)
        .where(Artifact.session_id == session_id, Artifact.tenant_id == tenant_id, Artifact.archived_by.is_(None))
        .order_by(Artifact.position)
    )
    return await open_artifacts(sealer, list((await db.execute(stmt)).scalars()))


async def list_all(db: AsyncSession, sealer: Sealer, tenant_id: str, session_id: str) -> list[Artifact]:
    """Every artifact, archived ones included, in position order: what a forget replays from."""
    stmt = (
        select(Artifact)
        .where(Artifact.session_id == session_id, Artifact.tenant_id == tenant_id)
        .order_by(Artifact.position)
    )
    return await open_artifacts(sealer, list((await db.execute(stmt)).scalars()))


async def max_position(db: AsyncSession, session_id: str) -> int:
    stmt = select(func.coalesce(func.max(Artifact.position), -1)).where(Artifact.session_id == session_id)
    return int((await db.execute(stmt)).scalar_one())


async def archive(db: AsyncSession, session_id: str, ids: Sequence[str], turn: int) -> None:
    if ids:
        await db.execute(
            update(Artifact)
            .where(Artifact.session_id == session_id, Artifact.id.in_(list(ids)))
            .values(archived_by=turn)
        )


async def unarchive_from(db: AsyncSession, session_id: str, turn: int) -> None:
    """Undo the archiving of compactions at transitions ≥ `turn` (a replay re-runs them)."""
    await db.execute(
        update(Artifact).where(Artifact.session_id == session_id, Artifact.archived_by >= turn).values(archived_by=None)
    )


async def get(db: AsyncSession, sealer: Sealer, tenant_id: str, session_id: str, artifact_id: str) -> Artifact | None:
    stmt = select(Artifact).where(
        Artifact.id == artifact_id, Artifact.session_id == session_id, Artifact.tenant_id == tenant_id
    )
    return await _one(sealer, (await db.execute(stmt)).scalar_one_or_none())


async def _one(sealer: Sealer, row: Artifact | None) -> Artifact | None:
    return None if row is None else (await open_artifacts(sealer, [row]))[0]


async def parents_of(db: AsyncSession, session_id: str, child_ids: Sequence[str] | None = None) -> dict[str, list[str]]:
    """child id → parent ids in log order (all children of the session when `child_ids` is None)."""
    parent = Artifact.__table__.alias("parent")
    stmt = (
        select(ProvenanceEdge.child_id, ProvenanceEdge.parent_id)
        .join(parent, parent.c.id == ProvenanceEdge.parent_id)
        .where(ProvenanceEdge.session_id == session_id)
        .order_by(ProvenanceEdge.child_id, parent.c.position)
    )
    if child_ids is not None:
        stmt = stmt.where(ProvenanceEdge.child_id.in_(list(child_ids)))
    out: dict[str, list[str]] = {}
    for child_id, parent_id in (await db.execute(stmt)).all():
        out.setdefault(child_id, []).append(parent_id)
    return out


def _closure_cte(session_id: str, root_id: str) -> Any:
    # UNION (not UNION ALL) drops ids already reached, so the recursion visits each artifact once on a DAG.
    closure = select(literal(root_id, String).label("id")).cte("closure", recursive=True)
    step = (
        select(ProvenanceEdge.child_id)
        .join(closure, ProvenanceEdge.parent_id == closure.c.id)
        .where(ProvenanceEdge.session_id == session_id)
    )
    return closure.union(step)


_JOIN_SETTINGS = ("enable_hashjoin", "enable_mergejoin")


@asynccontextmanager
async def _index_walk(db: AsyncSession) -> AsyncIterator[None]:
    """Plan the closure's recursive step as one index probe per reached artifact.

    The planner guesses 10 rows for a recursion's working table and, on small sessions, hashes the session's whole
    edge list at every level; the closure of the full policy's reduced edges is a chain, one artifact per level, so
    that costs O(depth x edges) (30 ms at 1k artifacts against 1 ms probing provenance_edges' primary key, measured
    by bench/provenance_bench.py). The settings are transaction-local and restored right after."""
    previous = (await db.execute(select(*(func.current_setting(name) for name in _JOIN_SETTINGS)))).one()
    await db.execute(select(*(func.set_config(name, "off", True) for name in _JOIN_SETTINGS)))
    try:
        yield
    finally:
        await db.execute(select(*(func.set_config(n, v, True) for n, v in zip(_JOIN_SETTINGS, previous, strict=True))))


async def closure(db: AsyncSession, sealer: Sealer, tenant_id: str, session_id: str, root_id: str) -> list[Artifact]:
    """The root artifact and everything reachable from it over provenance edges, in log order."""
    cte = _closure_cte(session_id, root_id)
    stmt = (
        select(Artifact)
        .join(cte, Artifact.id == cte.c.id)
        .where(Artifact.session_id == session_id, Artifact.tenant_id == tenant_id)
        .order_by(Artifact.position)
    )
    async with _index_walk(db):
        rows = list((await db.execute(stmt)).scalars())
    return await open_artifacts(sealer, rows)


async def closure_ids(db: AsyncSession, session_id: str, root_id: str) -> list[str]:
    """The closure's ids only (the benchmark's query, and what a forget plan needs first)."""
    cte = _closure_cte(session_id, root_id)
    async with _index_walk(db):
        return list((await db.execute(select(cte.c.id))).scalars())


async def first_entry(db: AsyncSession, tenant_id: str, session_id: str, source_ids: Sequence[str]) -> int | None:
    """The turn of the earliest artifact carrying any of `source_ids` (τ of Algorithm 1), None if none does."""
    stmt = select(func.min(Artifact.turn)).where(
        Artifact.session_id == session_id,
        Artifact.tenant_id == tenant_id,
        Artifact.source_ids.op("&&")(array(list(source_ids), type_=String)),
    )
    value = (await db.execute(stmt)).scalar_one_or_none()
    return None if value is None else int(value)


async def find(db: AsyncSession, sealer: Sealer, tenant_id: str, artifact_id: str) -> Artifact | None:
    """An artifact by id in any of the tenant's sessions (a forget target names only the artifact)."""
    stmt = select(Artifact).where(Artifact.id == artifact_id, Artifact.tenant_id == tenant_id)
    return await _one(sealer, (await db.execute(stmt)).scalar_one_or_none())


async def edges_from_turn(db: AsyncSession, session_id: str, turn: int) -> list[tuple[str, str]]:
    """(parent, child) edges of the model calls of transitions ≥ `turn`: every edge a closure rooted at or after
    `turn` can follow (an edge's child is produced at its turn, never before its parents)."""
    stmt = select(ProvenanceEdge.parent_id, ProvenanceEdge.child_id).where(
        ProvenanceEdge.session_id == session_id, ProvenanceEdge.turn >= turn
    )
    return [(p, c) for p, c in (await db.execute(stmt)).all()]


@dataclass(frozen=True)
class Retired:
    """What a write took out of the store: the leaves its sealed content was under, read in the clear (the forget
    shreds them once it committed), and how many artifacts it erased were plaintext from before migration 0017 (their
    copies stay in dead tuples, WAL and backups: no shred reaches them, so the forget promises nothing at rest)."""

    leaves: list[int] = field(default_factory=list)
    plaintext: int = 0

    def add(self, other: Retired) -> Retired:
        return Retired([*self.leaves, *other.leaves], self.plaintext + other.plaintext)


def _retired(leaves: Sequence[int | None]) -> Retired:
    return Retired([leaf for leaf in leaves if leaf is not None], sum(leaf is None for leaf in leaves))


async def delete_from_turn(db: AsyncSession, session_id: str, turn: int) -> Retired:
    """Delete the artifacts of transitions ≥ `turn` (their provenance edges go with them, ON DELETE CASCADE)."""
    stmt = delete(Artifact).where(Artifact.session_id == session_id, Artifact.turn >= turn).returning(Artifact.leaf)
    return _retired((await db.execute(stmt)).scalars().all())


async def delete_ids(db: AsyncSession, session_id: str, ids: Sequence[str]) -> Retired:
    if not ids:
        return Retired()
    stmt = (
        delete(Artifact).where(Artifact.session_id == session_id, Artifact.id.in_(list(ids))).returning(Artifact.leaf)
    )
    return _retired((await db.execute(stmt)).scalars().all())


async def rewrite(db: AsyncSession, sealer: Sealer, session_id: str, rows: Sequence[dict[str, Any]]) -> Retired:
    """Update artifacts in place (content, tokens, span, meta), keyed by id; positions are left as they are. Returns
    what it retired, for the forget to shred.

    A row whose text or tokens changed is sealed under a fresh leaf: its old ciphertexts, in every copy of the
    database, must stop opening, so its old leaf is retired (and its embedding with it). A row whose span or meta
    only changed keeps its leaf and its ciphertexts, never sealed again. A changed row must say what its embedding
    becomes (`embedding`: the new vector, or None to have it recomputed on demand): the old vector would keep the
    forgotten text's meaning searchable."""
    if not rows:
        return Retired()
    stmt = select(Artifact).where(Artifact.session_id == session_id, Artifact.id.in_([row["id"] for row in rows]))
    current = {a.id: a for a in await open_artifacts(sealer, list((await db.execute(stmt)).scalars()))}
    retired = Retired()
    for row in rows:
        old = current[row["id"]]
        values: dict[str, Any] = {"token_start": row["token_start"], "token_end": row["token_end"], "meta": row["meta"]}
        leaf = old.leaf
        if old.erased or old.content != row["content"] or list(old.token_ids) != list(row["token_ids"]):
            retired = retired.add(_retired([leaf]))
            leaf = await sealer.leaf(old.tenant_id, session_id)
            values.update(await seal_content(sealer, leaf, old.tenant_id, old.id, row["content"], row["token_ids"]))
            values.update(await seal_vector(sealer, leaf, old.tenant_id, old.id, row.get("embedding")))
        elif "embedding" in row:
            if leaf is None:  # a row from before migration 0017, unchanged: it stays as it was but for its vector
                values["embedding"] = row["embedding"]
            else:
                values.update(await seal_vector(sealer, leaf, old.tenant_id, old.id, row["embedding"]))
        if leaf is not None:  # the client's members of meta sealed under the row's leaf (a legacy row: as it was)
            values.update(await seal_meta(sealer, leaf, old.tenant_id, old.id, row["meta"]))
        await db.execute(
            update(Artifact).where(Artifact.session_id == session_id, Artifact.id == row["id"]).values(**values)
        )
    return retired


# The expressions of ix_artifacts_memory_record, so the planner uses it.
_SESSIONS_WITH_MEMORY = Statement(
    """
    SELECT DISTINCT session_id FROM artifacts
     WHERE tenant_id = :tenant_id AND kind = 'memory' AND meta ->> 'namespace' = :namespace AND meta ->> 'key' = :key
     ORDER BY session_id
    """
)


async def sessions_with_memory(db: AsyncSession | Sql, tenant_id: str, namespace: str, key: str) -> list[str]:
    """Sessions holding an injection artifact of the memory record (namespace, key), any version."""
    sql = InSession(db) if isinstance(db, AsyncSession) else db
    rows = await sql.all(_SESSIONS_WITH_MEMORY, {"tenant_id": tenant_id, "namespace": namespace, "key": key})
    return [row["session_id"] for row in rows]


async def pending_calls(db: AsyncSession, sealer: Sealer, session_id: str) -> list[Artifact]:
    """tool_call artifacts no tool_result answers yet, in log order."""
    answer = Artifact.__table__.alias("answer")
    answered = (
        select(answer.c.id)
        .where(
            answer.c.session_id == Artifact.session_id,
            answer.c.kind == "tool_result",
            answer.c.meta["tool_call_id"].astext == Artifact.meta["tool_call_id"].astext,
        )
        .exists()
    )
    stmt = (
        select(Artifact)
        .where(
            Artifact.session_id == session_id, Artifact.kind == "tool_call", Artifact.archived_by.is_(None), ~answered
        )
        .order_by(Artifact.position)
    )
    return await open_artifacts(sealer, list((await db.execute(stmt)).scalars()))


async def mark_committed(db: AsyncSession, session_id: str, call_ids: Sequence[str]) -> None:
    if call_ids:
        await db.execute(
            update(Artifact)
            .where(
                Artifact.session_id == session_id,
                Artifact.kind == "tool_call",
                Artifact.meta["tool_call_id"].astext.in_(list(call_ids)),
            )
            .values(committed=True)
        )


async def tool_calls(db: AsyncSession, sealer: Sealer, session_id: str, call_ids: Sequence[str]) -> list[Artifact]:
    if not call_ids:
        return []
    stmt = select(Artifact).where(
        Artifact.session_id == session_id,
        Artifact.kind == "tool_call",
        Artifact.meta["tool_call_id"].astext.in_(list(call_ids)),
    )
    return await open_artifacts(sealer, list((await db.execute(stmt)).scalars()))
