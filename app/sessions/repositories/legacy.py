"""Sealing session content written before migrations 0017 and 0021: artifacts whose text, token ids and embedding
are clear, and documents' `source` labels.

`lethe keys seal` (app/keys/admin.py) walks artifacts in id order, a batch per transaction, and seals each one as a
new artifact is sealed (sealing.py): a fresh leaf of its session's stream, the three columns under it, the clear
ones emptied. Rows are locked `FOR UPDATE SKIP LOCKED`: a forget rewriting or deleting one is never waited for (the
next pass takes what was skipped), and one that comes after the seal finds a sealed row, whose leaf it shreds like
any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.db.statements import Sql, Statement
from app.keys.content import Sealer
from app.sessions.repositories.sealing import TABLE, seal_content, seal_meta, seal_vector

# In the clear: everything of a row from before 0017, or a document's `source` label of one from before 0021.
_CLEAR = """((leaf IS NULL AND (content IS NOT NULL OR token_ids IS NOT NULL OR embedding IS NOT NULL))
             OR (meta_sealed IS NULL AND meta -> 'source' IS NOT NULL))"""

_PAGE = Statement(
    f"""
    SELECT id, tenant_id, session_id, leaf, content, token_ids, embedding::real[] AS embedding, meta FROM artifacts
     WHERE id > :after AND {_CLEAR}
     ORDER BY id
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
    """
)

_SEAL = Statement(
    """
    UPDATE artifacts
       SET leaf = :leaf, content = NULL, content_sealed = :content_sealed, token_ids = NULL,
           token_ids_sealed = :token_ids_sealed, embedding = NULL, embedding_sealed = :embedding_sealed,
           meta = :meta, meta_sealed = :meta_sealed
     WHERE id = :id AND leaf IS NULL
    """,
    json=("meta",),
)

# A row sealed by 0017's code whose `source` label 0021 seals: under the artifact's own leaf.
_SEAL_META = Statement(
    "UPDATE artifacts SET meta = :meta, meta_sealed = :meta_sealed WHERE id = :id AND meta_sealed IS NULL",
    json=("meta",),
)

_LEFT = Statement(f"SELECT count(*) AS rows FROM artifacts WHERE {_CLEAR}")


@dataclass(frozen=True)
class Page:
    sealed: int
    after: str | None  # the cursor for the next page; None: the pass is over


FIRST = ""  # before every id


async def seal_page(sql: Sql, sealer: Sealer, after: str, limit: int) -> Page:
    """Seal up to `limit` clear artifacts after id `after`, in the caller's transaction."""
    rows = await sql.all(_PAGE, {"after": after, "limit": limit})
    if not rows:
        return Page(0, None)
    sealed = 0
    for row in rows:
        tenant_id, artifact_id = row["tenant_id"], row["id"]
        if row["leaf"] is not None:
            meta = await seal_meta(sealer, row["leaf"], tenant_id, artifact_id, row["meta"])
            sealed += await sql.rowcount(_SEAL_META, {"id": artifact_id, **meta})
            continue
        leaf = await sealer.leaf(tenant_id, row["session_id"])
        columns = await seal_content(sealer, leaf, tenant_id, artifact_id, row["content"] or "", row["token_ids"] or [])
        columns.update(await seal_vector(sealer, leaf, tenant_id, artifact_id, row["embedding"]))
        columns.update(await seal_meta(sealer, leaf, tenant_id, artifact_id, row["meta"]))
        sealed += await sql.rowcount(_SEAL, {
            "id": artifact_id, "leaf": leaf, "content_sealed": columns["content_sealed"],
            "token_ids_sealed": columns["token_ids_sealed"], "embedding_sealed": columns["embedding_sealed"],
            "meta": columns["meta"], "meta_sealed": columns["meta_sealed"],
        })
    return Page(sealed, rows[-1]["id"])


async def left(sql: Sql) -> int:
    row = await sql.one(_LEFT, {})
    return int(row["rows"]) if row else 0


TABLES = (TABLE,)
