"""SQL for finding artifacts by meaning or by words: pgvector similarity over stored embeddings (retrieval sessions'
context, query targets of a forget) and PostgreSQL full-text search (keyword targets). Callers have checked the
session's tenant."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact


@dataclass(frozen=True)
class Neighbor:
    """A stored message as retrieval returns it."""

    id: str
    kind: str
    turn: int
    position: int
    content: str
    source_ids: list[str]
    similarity: float


async def nearest_messages(
    db: AsyncSession,
    session_id: str,
    vector: list[float],
    *,
    kinds: Sequence[str],
    before_turn: int,
    top_k: int,
    min_similarity: float,
    exclude: Sequence[str] = (),
) -> list[Neighbor]:
    """The `top_k` live messages of transitions before `before_turn` most similar to `vector` (cosine, at least
    `min_similarity`), nearest first, ties broken by log order. An exact scan of the session's rows (they are found by
    the session index): exact top-k is what makes a reply's context reproducible, and an approximate index filtered
    to one session can return fewer than k rows."""
    distance = Artifact.embedding.cosine_distance(vector)
    stmt = (
        select(
            Artifact.id, Artifact.kind, Artifact.turn, Artifact.position, Artifact.content, Artifact.source_ids,
            (1.0 - distance).label("similarity"),
        )
        .where(
            Artifact.session_id == session_id,
            Artifact.archived_by.is_(None),
            Artifact.kind.in_(list(kinds)),
            Artifact.turn < before_turn,
            Artifact.embedding.is_not(None),
            distance <= 1.0 - min_similarity,
        )
        .order_by(distance, Artifact.position)
        .limit(top_k)
    )
    if exclude:
        stmt = stmt.where(Artifact.id.not_in(list(exclude)))
    return [
        Neighbor(r.id, r.kind, r.turn, r.position, r.content, list(r.source_ids), float(r.similarity))
        for r in (await db.execute(stmt)).all()
    ]


async def unembedded(db: AsyncSession, session_id: str, kinds: Sequence[str]) -> list[Artifact]:
    """Live artifacts of `kinds` without an embedding (new, or rewritten by a forget)."""
    stmt = select(Artifact).where(
        Artifact.session_id == session_id,
        Artifact.archived_by.is_(None),
        Artifact.embedding.is_(None),
        Artifact.kind.in_(list(kinds)),
    )
    return list((await db.execute(stmt)).scalars())


async def keyword_matches(db: AsyncSession, session_id: str, keyword: str, kinds: Sequence[str]) -> list[str]:
    """Live artifacts of `kinds` matching `keyword` under PostgreSQL full-text search (English stemming, web-search
    syntax: `guitar`, `"live in Paris"`, `guitar or piano`), in log order."""
    query = func.websearch_to_tsquery("english", keyword)
    stmt = (
        select(Artifact.id)
        .where(
            Artifact.session_id == session_id,
            Artifact.archived_by.is_(None),
            Artifact.kind.in_(list(kinds)),
            func.to_tsvector("english", Artifact.content).op("@@")(query),
        )
        .order_by(Artifact.position)
    )
    return list((await db.execute(stmt)).scalars())


async def unembedded_observations(db: AsyncSession, session_id: str, model_kinds: Sequence[str]) -> list[Artifact]:
    stmt = select(Artifact).where(
        Artifact.session_id == session_id, Artifact.embedding.is_(None), Artifact.kind.not_in(list(model_kinds))
    )
    return list((await db.execute(stmt)).scalars())


async def set_embeddings(db: AsyncSession, vectors: dict[str, list[float]]) -> None:
    for artifact_id, vector in vectors.items():
        await db.execute(update(Artifact).where(Artifact.id == artifact_id).values(embedding=vector))


async def similar_observations(
    db: AsyncSession, session_id: str, vector: list[float], min_similarity: float, model_kinds: Sequence[str]
) -> list[str]:
    """Observations whose cosine similarity to `vector` is at least `min_similarity` (pgvector `<=>`)."""
    distance = Artifact.embedding.cosine_distance(vector)
    stmt = (
        select(Artifact.id)
        .where(
            Artifact.session_id == session_id,
            Artifact.kind.not_in(list(model_kinds)),
            Artifact.embedding.is_not(None),
            distance <= 1.0 - min_similarity,
        )
        .order_by(distance)
    )
    return list((await db.execute(stmt)).scalars())
