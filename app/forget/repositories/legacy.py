"""Forget jobs written before migration 0019, for `lethe keys seal` (app/keys/admin.py): an ended job's reason was
kept in the clear, and a reason can quote what the job forgot. An ended job needs its reason no more (the jobs
sealed since drop it when they end, their leaf shredded), so the reason is dropped, not sealed. Live jobs from
before 0019 keep theirs until they end."""

from __future__ import annotations

from dataclasses import dataclass

from app.db.statements import Sql, Statement
from app.keys.content import Sealer

_ENDED = "status IN ('succeeded', 'failed')"

_DROP = Statement(
    f"""
    WITH page AS (
        SELECT id FROM forget_jobs
         WHERE id > :after AND leaf IS NULL AND reason IS NOT NULL AND {_ENDED}
         ORDER BY id
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
    )
    UPDATE forget_jobs j SET reason = NULL FROM page WHERE j.id = page.id RETURNING j.id
    """
)

_LEFT = Statement(f"SELECT count(*) AS rows FROM forget_jobs WHERE leaf IS NULL AND reason IS NOT NULL AND {_ENDED}")


@dataclass(frozen=True)
class Page:
    sealed: int
    after: str | None


FIRST = ""
TABLES = ("forget_jobs",)


async def seal_page(sql: Sql, _sealer: Sealer, after: str, limit: int) -> Page:
    rows = await sql.all(_DROP, {"after": after, "limit": limit})
    ids = sorted(r["id"] for r in rows)
    return Page(len(ids), ids[-1] if len(ids) == limit else None)


async def left(sql: Sql) -> int:
    row = await sql.one(_LEFT, {})
    return int(row["rows"]) if row else 0
