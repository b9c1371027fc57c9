"""Finding artifacts by meaning or by words: cosine similarity over their embeddings (retrieval sessions' context,
query targets of a forget) and PostgreSQL full-text search (keyword targets). Callers have checked the session's
tenant.

Embeddings and text are sealed at rest (app/sessions/repositories/sealing.py), so the database can no longer rank or
match them: the session's candidate rows are selected (the session index finds them), opened here, and ranked in
the process, an exact scan as before (exact top-k is what makes a reply's context reproducible). Full-text matching
keeps PostgreSQL's semantics (English stemming, web-search syntax) by running the same functions over the opened
texts passed as a statement parameter: nothing is written, so no plaintext reaches a table, an index or the WAL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import ARRAY, Text, any_, bindparam, cast, literal_column, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Artifact
from app.keys.content import Sealer
from app.keys.errors import Erased
from app.sessions.repositories.sealing import open_artifacts, open_text, open_vector, seal_vector


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


_EMBEDDED = or_(Artifact.embedding.is_not(None), Artifact.embedding_sealed.is_not(None))
_UNEMBEDDED = (Artifact.embedding.is_(None)) & (Artifact.embedding_sealed.is_(None))


# The row version an opened vector belongs to: an embedding rewritten under the same leaf is another version.
_VERSION = literal_column("artifacts.xmin::text", Text).label("version")


async def _ranked(db: AsyncSession, sealer: Sealer, where: Sequence[Any], vector: list[float], min_similarity: float
                  ) -> list[tuple[float, Any]]:
    """(similarity, row) of the embedded rows `where` selects whose cosine similarity to `vector` is at least
    `min_similarity`, most similar first, ties in log order. Rows whose leaf was shredded are left out.

    The candidates are read without their ciphertexts; only the vectors this process has not opened yet at that row
    version (`Sealer.recall`) are fetched and opened, then kept. A session ranked turn after turn opens each
    vector once."""
    stmt = select(Artifact.id, Artifact.tenant_id, Artifact.position, Artifact.leaf, _VERSION).where(
        *where, _EMBEDDED).order_by(Artifact.position)
    candidates = (await db.execute(stmt)).all()
    opened: dict[str, Any] = {}
    for row in candidates:
        if row.leaf is not None:
            hit = sealer.recall(row.tenant_id, row.leaf, ("vector", row.id, row.version))
            if hit is not None:
                opened[row.id] = hit
    missing = [row.id for row in candidates if row.id not in opened]
    if missing:
        fetch = select(
            Artifact.id, Artifact.tenant_id, Artifact.leaf, _VERSION, Artifact.embedding, Artifact.embedding_sealed,
        ).where(Artifact.id == any_(cast(missing, ARRAY(Text))))
        for stored in (await db.execute(fetch)).all():
            try:
                found = await open_vector(sealer, stored.tenant_id, stored.id, stored.embedding,
                                          stored.embedding_sealed)
            except Erased:
                continue
            if found is not None:
                opened[stored.id] = found
                if stored.leaf is not None and stored.embedding_sealed is not None:
                    sealer.keep(stored.tenant_id, stored.leaf, ("vector", stored.id, stored.version), found)
    rows = [row for row in candidates if row.id in opened]
    if not rows:
        return []
    # pgvector's `<=>` in double precision over the stored float32 vectors: 1 - a·b / (|a| |b|).
    matrix = np.stack([opened[row.id] for row in rows]).astype(np.float64)
    query = np.asarray(vector, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(query)
    with np.errstate(invalid="ignore", divide="ignore"):
        similarity = np.clip(matrix @ query / norms, -1.0, 1.0)
    distance = 1.0 - similarity
    kept = np.flatnonzero(distance <= 1.0 - min_similarity)
    positions = np.fromiter((rows[i].position for i in kept), dtype=np.int64, count=len(kept))
    order = kept[np.lexsort((positions, distance[kept]))]  # by distance, ties in log order
    return [(float(similarity[i]), rows[i]) for i in order]


async def nearest_messages(
    db: AsyncSession,
    sealer: Sealer,
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
    `min_similarity`), nearest first, ties broken by log order: an exact scan of the session's rows."""
    where = [
        Artifact.session_id == session_id,
        Artifact.archived_by.is_(None),
        Artifact.kind.in_(list(kinds)),
        Artifact.turn < before_turn,
    ]
    if exclude:
        where.append(Artifact.id.not_in(list(exclude)))
    nearest = (await _ranked(db, sealer, where, vector, min_similarity))[:top_k]
    # The top k's own columns and texts only: the ranking read ids, positions and leaves.
    details = select(Artifact.id, Artifact.kind, Artifact.turn, Artifact.source_ids, Artifact.content,
                     Artifact.content_sealed).where(Artifact.id.in_([r.id for _, r in nearest]))
    stored = {row.id: row for row in (await db.execute(details)).all()} if nearest else {}
    out = []
    for similarity, r in nearest:
        if (found := stored.get(r.id)) is None:
            continue
        try:
            content = await open_text(sealer, r.tenant_id, r.id, found.content, found.content_sealed)
        except Erased:  # shredded since its vector was opened here (another process's forget, not yet told)
            continue
        out.append(Neighbor(r.id, found.kind, found.turn, r.position, content, list(found.source_ids), similarity))
    return out


async def unembedded(db: AsyncSession, sealer: Sealer, session_id: str, kinds: Sequence[str]) -> list[Artifact]:
    """Live artifacts of `kinds` without an embedding (new, or rewritten by a forget)."""
    stmt = select(Artifact).where(
        Artifact.session_id == session_id, Artifact.archived_by.is_(None), _UNEMBEDDED, Artifact.kind.in_(list(kinds))
    )
    return [a for a in await open_artifacts(sealer, list((await db.execute(stmt)).scalars())) if not a.erased]


_TEXT_MATCHES = text(
    "SELECT t.ord FROM unnest(:bodies) WITH ORDINALITY AS t(body, ord)"
    " WHERE to_tsvector('english', t.body) @@ websearch_to_tsquery('english', :keyword) ORDER BY t.ord"
).bindparams(bindparam("bodies", type_=ARRAY(Text)))


async def keyword_matches(
    db: AsyncSession, sealer: Sealer, session_id: str, keyword: str, kinds: Sequence[str]
) -> list[str]:
    """Live artifacts of `kinds` matching `keyword` under PostgreSQL full-text search (English stemming, web-search
    syntax: `guitar`, `"live in Paris"`, `guitar or piano`), in log order."""
    stmt = select(Artifact).where(
        Artifact.session_id == session_id, Artifact.archived_by.is_(None), Artifact.kind.in_(list(kinds))
    ).order_by(Artifact.position)
    rows = [a for a in await open_artifacts(sealer, list((await db.execute(stmt)).scalars())) if not a.erased]
    if not rows:
        return []
    hits = await db.execute(_TEXT_MATCHES, {"bodies": [a.content for a in rows], "keyword": keyword})
    return [rows[ordinal - 1].id for (ordinal,) in hits.all()]


async def unembedded_observations(
    db: AsyncSession, sealer: Sealer, session_id: str, model_kinds: Sequence[str]
) -> list[Artifact]:
    stmt = select(Artifact).where(
        Artifact.session_id == session_id, _UNEMBEDDED, Artifact.kind.not_in(list(model_kinds))
    )
    return [a for a in await open_artifacts(sealer, list((await db.execute(stmt)).scalars())) if not a.erased]


async def set_embeddings(db: AsyncSession, sealer: Sealer, vectors: dict[str, list[float]]) -> None:
    """Each artifact's vector, sealed under its leaf (as plaintext on a row from before migration 0017)."""
    if not vectors:
        return
    stmt = select(Artifact.id, Artifact.tenant_id, Artifact.leaf).where(Artifact.id.in_(list(vectors)))
    for artifact_id, tenant_id, leaf in (await db.execute(stmt)).all():
        vector = vectors[artifact_id]
        if leaf is None:
            values: dict[str, Any] = {"embedding": vector}
        else:
            values = await seal_vector(sealer, leaf, tenant_id, artifact_id, vector)
        await db.execute(update(Artifact).where(Artifact.id == artifact_id).values(**values))


async def similar_observations(
    db: AsyncSession, sealer: Sealer, session_id: str, vector: list[float], min_similarity: float,
    model_kinds: Sequence[str],
) -> list[str]:
    """Observations whose cosine similarity to `vector` is at least `min_similarity`, most similar first."""
    where = [Artifact.session_id == session_id, Artifact.kind.not_in(list(model_kinds))]
    return [row.id for _, row in await _ranked(db, sealer, where, vector, min_similarity)]
