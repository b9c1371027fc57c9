"""SQL of the key layer: the key store's identity the database records, and scans of sealed columns for `verify`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from app.db.statements import Row, Sql, Statement
from app.keys.sealed import SealedColumn

# Two processes starting together both insert; one row wins and both read it back (the loser then compares).
_RECORD_IDENTITY = Statement(
    "INSERT INTO key_store (one, identity, provider) VALUES (true, :identity, :provider) ON CONFLICT (one) DO NOTHING"
)
_IDENTITY = Statement("SELECT identity, provider FROM key_store WHERE one")


@dataclass(frozen=True)
class RecordedStore:
    identity: str
    provider: str


async def record_identity(sql: Sql, identity: str, provider: str) -> RecordedStore:
    """The key store the database knows: `identity` if it knew none yet (recorded now), else the one it had."""
    await sql.rowcount(_RECORD_IDENTITY, {"identity": identity, "provider": provider})
    row = await sql.one(_IDENTITY, {})
    assert row is not None  # inserted above, and never deleted
    return RecordedStore(row["identity"], row["provider"])


@cache
def _page(column: SealedColumn, *, first: bool, one_tenant: bool) -> Statement:
    # Identifiers come from the declarations in code (app/keys/sealed.py), never from input.
    where = [" OR ".join(f"{name} IS NOT NULL" for name in column.ciphertexts)]
    if column.only is not None:
        where.append(column.only)
    if one_tenant:
        where.append(f"{column.tenant} = :tenant")
    if not first:
        where.append(f"({', '.join(column.key)}) > ({', '.join(f':after_{i}' for i in range(len(column.key)))})")
    return Statement(
        f"SELECT {', '.join(column.selected())} FROM {column.table} WHERE {' AND '.join(f'({w})' for w in where)} "
        f"ORDER BY {', '.join(column.key)} LIMIT :limit"
    )


async def sealed_rows(
    sql: Sql, column: SealedColumn, *, tenant: str | None, after: tuple[object, ...] | None, limit: int
) -> list[Row]:
    """The next `limit` rows of `column.table` holding a ciphertext (of `tenant`, or of every tenant), in key order
    after `after`: keyset pagination, each page one range scan of the key's index, so memory stays bounded."""
    params: dict[str, object] = {"limit": limit}
    if tenant is not None:
        params["tenant"] = tenant
    if after is not None:
        params.update({f"after_{i}": value for i, value in enumerate(after)})
    return await sql.all(_page(column, first=after is None, one_tenant=tenant is not None), params)
