"""Sealing memory written before migration 0016: plaintext values in `memory_records` and `memory_versions`.

`lethe keys seal` (app/keys/admin.py) walks the records in key order, a batch per transaction, and seals each key's
plaintext under the leaf its incarnation would have had (sealing.py): the head's leaf when the head is sealed
already (a record written again after the upgrade), a fresh one otherwise, so a later forget of the key punctures
one leaf and with it every version. Rows are locked `FOR UPDATE SKIP LOCKED`: a writer or a forget holding a record
is never waited for (the next pass takes what was skipped), and either one that comes after the seal sees sealed
rows, which it reads and erases like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.db.statements import Sql, Statement
from app.keys.content import Sealer
from app.memory.repositories.sealing import RECORDS, VERSIONS, binding

# A page of records after the cursor, locked; those with nothing in the clear are only passed over.
_PAGE = Statement(
    """
    SELECT tenant_id, namespace, key, version, value, leaf, forgotten FROM memory_records
     WHERE (tenant_id, namespace, key) > (:tenant_id, :namespace, :key)
     ORDER BY tenant_id, namespace, key
     LIMIT :limit
       FOR UPDATE SKIP LOCKED
    """,
    json=("value",),
)

# The page's history rows still in the clear.
_HISTORY = Statement(
    """
    SELECT v.tenant_id, v.namespace, v.key, v.version, v.value
      FROM memory_versions v
      JOIN unnest(CAST(:tenants AS text[]), CAST(:namespaces AS text[]), CAST(:keys AS text[])) AS p(t, n, k)
        ON v.tenant_id = p.t AND v.namespace = p.n AND v.key = p.k
     WHERE v.value IS NOT NULL
    """,
    json=("value",),
)

_SEAL_HEAD = Statement(
    """
    UPDATE memory_records SET value = NULL, value_sealed = :sealed, leaf = :leaf
     WHERE tenant_id = :tenant_id AND namespace = :namespace AND key = :key AND version = :version
       AND value IS NOT NULL
    """
)

_SEAL_VERSION = Statement(
    """
    UPDATE memory_versions SET value = NULL, value_sealed = :sealed, leaf = :leaf
     WHERE tenant_id = :tenant_id AND namespace = :namespace AND key = :key AND version = :version
       AND value IS NOT NULL
    """
)

_LEFT = Statement(
    """
    SELECT (SELECT count(*) FROM memory_records WHERE value IS NOT NULL)
         + (SELECT count(*) FROM memory_versions WHERE value IS NOT NULL) AS rows
    """
)

Key = tuple[str, str, str]


@dataclass(frozen=True)
class Page:
    sealed: int  # rows sealed (heads and history rows)
    after: Key | None  # the cursor for the next page; None: the pass is over


async def seal_page(sql: Sql, sealer: Sealer, after: Key, limit: int) -> Page:
    """Seal the plaintext of up to `limit` records after `after`, in the caller's transaction."""
    heads = await sql.all(_PAGE, {"tenant_id": after[0], "namespace": after[1], "key": after[2], "limit": limit})
    if not heads:
        return Page(0, None)
    history = await sql.all(_HISTORY, {
        "tenants": [h["tenant_id"] for h in heads], "namespaces": [h["namespace"] for h in heads],
        "keys": [h["key"] for h in heads],
    })
    versions: dict[Key, list[tuple[int, object]]] = {}
    for v in history:
        versions.setdefault((v["tenant_id"], v["namespace"], v["key"]), []).append((v["version"], v["value"]))
    sealed = 0
    for head in heads:
        key: Key = (head["tenant_id"], head["namespace"], head["key"])
        clear_head = head["value"] is not None
        if not clear_head and key not in versions:
            continue
        tenant_id, namespace, name = key
        live_leaf = head["leaf"] if not head["forgotten"] else None
        leaf = live_leaf if live_leaf is not None else await sealer.leaf(tenant_id, namespace)
        if clear_head:
            ciphertext = await sealer.seal_json(
                leaf, binding(tenant_id, RECORDS, namespace, name, head["version"]), head["value"]
            )
            sealed += await sql.rowcount(_SEAL_HEAD, {
                "sealed": ciphertext, "leaf": leaf, "tenant_id": tenant_id, "namespace": namespace, "key": name,
                "version": head["version"],
            })
        for version, value in versions.get(key, []):
            ciphertext = await sealer.seal_json(leaf, binding(tenant_id, VERSIONS, namespace, name, version), value)
            sealed += await sql.rowcount(_SEAL_VERSION, {
                "sealed": ciphertext, "leaf": leaf, "tenant_id": tenant_id, "namespace": namespace, "key": name,
                "version": version,
            })
    last = heads[-1]
    return Page(sealed, (last["tenant_id"], last["namespace"], last["key"]))


FIRST: Key = ("", "", "")  # before every key


async def left(sql: Sql) -> int:
    """Rows still holding plaintext (a count: two scans, for the end of a run)."""
    row = await sql.one(_LEFT, {})
    return int(row["rows"]) if row else 0


TABLES = (RECORDS, VERSIONS)
