"""A search under a namespace prefix reads that prefix's live records through their index (migration 0028,
`ix_memory_records_live_namespaces`), never the table: PostgreSQL's plan of the exact statement the repository sends,
as a custom plan and as the generic plan a prepared statement falls back to, scans that index with the prefix's byte
range as its index condition. Without the index (dropped in a transaction that is rolled back) the same check fails:
the test tells them apart.

Thousands of records are seeded with SQL (rows from before sealing: plaintext `value`, no leaf, so no key is needed),
in namespaces around the prefix in byte order, and the route then finds exactly the prefix's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from app.memory.repositories.search import under_statement
from tests.support import custom_and_generic_plans, rolled_back, sql

INDEX = "ix_memory_records_live_namespaces"
NAMESPACES, PER_NAMESPACE = 300, 10


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


def _assert_index_serves(plan: dict[str, Any]) -> None:
    """The one node reading memory_records scans INDEX from the prefix to its end, both bounds index conditions."""
    (scan,) = [n for n in _nodes(plan) if n.get("Relation Name") == "memory_records"]
    assert scan["Node Type"] in ("Index Scan", "Bitmap Heap Scan"), json.dumps(plan)
    scans = [n for n in _nodes(plan) if n.get("Index Name") == INDEX]
    assert scans, json.dumps(plan)
    for index in scans:  # one, or one per arm of the exact test (a BitmapOr), each bounded by the byte range
        for bound in ("~>=~", "~<~"):
            assert bound in index["Index Cond"], json.dumps(plan)


async def _plans(database_url: str, tenant_id: str, prefix: str, *, drop: bool) -> tuple[Any, Any]:
    """EXPLAIN (FORMAT JSON) of the statement: the custom plan and the generic plan. `drop`: with the index dropped,
    in a transaction rolled back afterwards."""
    statement, params = under_statement(tenant_id, prefix)
    async with rolled_back(database_url, drop_index=INDEX if drop else None) as conn:
        return await custom_and_generic_plans(conn, statement, params, "under")


def test_a_prefix_search_scans_the_prefixs_range_of_its_index(
    client: httpx.Client, ns: str, database_url: str
) -> None:
    assert client.put(f"/v1/memory/{ns}/seed", json={"value": 1, "source": "user"},
                      headers={"If-None-Match": "*"}).status_code == 201
    (row,) = sql(database_url, "SELECT tenant_id FROM memory_records WHERE namespace = $1", ns)
    tenant_id = row["tenant_id"]
    # Namespaces on both sides of the prefix in byte order, a sibling inside its byte range (`-` sorts before `.`),
    # and the prefix's own children.
    names = [f"{ns}{tail}{n:03d}" for n in range(NAMESPACES // 3) for tail in ("-", "a", "")]
    names += [f"{ns[:-1]}{n:03d}" for n in range(NAMESPACES // 3)]
    children = [f"{ns}.c{n:03d}" for n in range(5)]
    sql(database_url, """
        INSERT INTO memory_records (tenant_id, namespace, key, version, value, forgotten, source)
        SELECT $1, n, 'k' || i, 1, to_jsonb(n), false, 'user'
          FROM unnest($2::text[]) n, generate_series(1, $3) i
        """, tenant_id, names + children, PER_NAMESPACE)
    sql(database_url, "ANALYZE memory_records")

    for plan in asyncio.run(_plans(database_url, tenant_id, ns, drop=False)):
        _assert_index_serves(plan)
    for plan in asyncio.run(_plans(database_url, tenant_id, ns, drop=True)):
        try:
            _assert_index_serves(plan)
        except (AssertionError, ValueError):
            continue
        raise AssertionError(f"the plan passes without {INDEX}: {json.dumps(plan)}")

    found = client.post("/v1/memory:search", json={"namespace_prefix": ns, "limit": 100})
    assert found.status_code == 200, found.text
    assert {i["namespace"] for i in found.json()["items"]} == {ns, *children}
