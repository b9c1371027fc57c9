"""The tenant's checkpoint listing (`GET /v1/threads:checkpoints`, LangGraph's list(None)) is served by its index
(migration 0027, `ix_thread_checkpoints_listing`), and a thread's listing in one namespace (`GET
/v1/threads/{id}/checkpoints?checkpoint_ns=`, LangGraph's list(config)) by the primary key: PostgreSQL's plan of the
exact statement the repository sends, for every combination of `before` and cursor, as a custom plan and as the
generic plan a prepared statement falls back to, is a backward scan of that index stopped at the LIMIT, with the
bounds as index conditions and no Sort of the rows. Without the listing index (dropped in a transaction that is
rolled back) the same check fails: the test tells them apart.

Thousands of checkpoints are seeded with SQL (rows from before sealing: a leaf of NULL, so no key is needed); the
routes then page through them in the order the index gives."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx

from app.threads.repositories.reads import namespace_listing, tenant_listing
from tests.support import custom_and_generic_plans, rolled_back, sql

INDEX = "ix_thread_checkpoints_listing"
THREADS, PER_THREAD = 40, 100


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in _nodes(child))]


def _listing_scan(plan: dict[str, Any]) -> dict[str, Any]:
    """The node that reads thread_checkpoints for the page, after checking that nothing sorts its rows: the LIMIT
    over it has no Sort below it."""
    limits = [n for n in _nodes(plan) if n["Node Type"] == "Limit"
              and any(m.get("Relation Name") == "thread_checkpoints" for m in _nodes(n))]
    assert len(limits) == 1, json.dumps(plan)
    below = _nodes(limits[0])[1:]
    assert not [n for n in below if n["Node Type"] in ("Sort", "Incremental Sort")], json.dumps(limits[0])
    (scan,) = [n for n in below if n.get("Relation Name") == "thread_checkpoints"]
    return scan


def _assert_index_serves(plan: dict[str, Any], bounds: list[str], index: str = INDEX) -> None:
    scan = _listing_scan(plan)
    assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), json.dumps(scan)
    assert scan["Index Name"] == index and scan["Scan Direction"] == "Backward", json.dumps(scan)
    for bound in bounds:  # a bound the scan starts from, not a filter applied to every entry of the tenant
        assert bound in scan["Index Cond"], json.dumps(scan)


async def _plans(
    database_url: str, tenant_id: str, cases: list[dict[str, Any]], *, drop: bool, thread_id: str | None = None
) -> list[Any]:
    """EXPLAIN (FORMAT JSON) of each case's statement: the custom plan for its parameters and the generic plan.
    `drop`: with the index dropped, in a transaction rolled back afterwards. `thread_id`: the cases are of that
    thread's listing in one namespace (`namespace_listing`), else of the tenant's."""
    async with rolled_back(database_url, drop_index=INDEX if drop else None) as conn:
        found = []
        for n, case in enumerate(cases):
            statement, params = (
                tenant_listing(tenant_id, **case) if thread_id is None
                else namespace_listing(tenant_id, thread_id, **case)
            )
            found.append(await custom_and_generic_plans(conn, statement, params, f"listing{n}"))
        return found


def _seed(database_url: str, tenant_id: str, run: str) -> list[tuple[str, str]]:
    """THREADS threads of PER_THREAD checkpoints each, the same ids in every thread (ties broken by thread id);
    answers (checkpoint_id, thread_id) of every row, the listing's order (ids and thread ids are digits and lowercase
    letters of one length: every collation orders them as Python does)."""
    threads = [f"lst{run}{t:03d}" for t in range(THREADS)]

    sql(database_url, "INSERT INTO threads (tenant_id, thread_id) SELECT $1, unnest($2::text[])", tenant_id, threads)
    sql(database_url, """
        INSERT INTO thread_checkpoints
               (tenant_id, thread_id, checkpoint_ns, checkpoint_id, parent_id, type, checkpoint, metadata, versions,
                generation)
        SELECT $1, t, '', lpad(i::text, 6, '0'), NULL, 'msgpack', '\\x80'::bytea, '{}'::jsonb, '{}'::jsonb, 0
          FROM unnest($2::text[]) t, generate_series(0, $3 - 1) i
        """, tenant_id, threads, PER_THREAD)
    rows = [(f"{i:06d}", thread) for thread in threads for i in range(PER_THREAD)]
    return sorted(rows, reverse=True)


def _tenant_of_a_first_thread(client: httpx.Client, database_url: str, run: str) -> str:
    """Store one checkpoint through the route (thread `lst<run>seed`, the newest id of the run): the tenant's id."""
    assert client.put(f"/v1/threads/lst{run}seed/checkpoints/{PER_THREAD:06d}", json={
        "checkpoint_ns": "", "parent_id": None, "checkpoint": {"type": "msgpack", "data": "gA=="},
        "metadata": {}, "channel_versions": {}, "blobs": [],
    }).status_code == 200
    (row,) = sql(database_url, "SELECT tenant_id FROM threads WHERE thread_id = $1", f"lst{run}seed")
    tenant_id: str = row["tenant_id"]
    return tenant_id


def test_the_tenant_listing_is_an_index_scan_from_its_cursor(
    fresh_tenant: httpx.Client, database_url: str
) -> None:
    run = uuid.uuid4().hex[:8]
    tenant_id = _tenant_of_a_first_thread(fresh_tenant, database_url, run)
    expected = [(f"{PER_THREAD:06d}", f"lst{run}seed"), *_seed(database_url, tenant_id, run)]

    cursor_row = {"checkpoint_id": "000070", "thread_id": f"lst{run}020", "checkpoint_ns": ""}
    cases = [
        {"checkpoint_ns": None, "before": None, "after": None, "limit": 101},
        {"checkpoint_ns": None, "before": "000050", "after": None, "limit": 101},
        {"checkpoint_ns": None, "before": None, "after": cursor_row, "limit": 101},
        {"checkpoint_ns": None, "before": "000090", "after": cursor_row, "limit": 101},
        {"checkpoint_ns": "", "before": "000090", "after": cursor_row, "limit": 101},
    ]
    before = "((checkpoint_id)::text < "
    after = "ROW((checkpoint_id)::text, (thread_id)::text, (checkpoint_ns)::text) < "
    bounds = [[], [before], [after], [before, after], [before, after]]
    plans = _plans_of(database_url, tenant_id, cases, drop=False)
    for (custom, generic), wanted in zip(plans, bounds, strict=True):
        _assert_index_serves(custom, wanted)
        _assert_index_serves(generic, wanted)

    # The check fails without the index: the tenant's rows are sorted (or scanned by another index) instead.
    for custom, generic in _plans_of(database_url, tenant_id, cases, drop=True):
        for plan in (custom, generic):
            try:
                _assert_index_serves(plan, [])
            except AssertionError:
                continue
            raise AssertionError(f"the plan passes without {INDEX}: {json.dumps(plan)}")

    # The route pages through the tenant's checkpoints in that order, with and without `before`.
    def listing(**params: Any) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        cursor = None
        while True:
            answer = fresh_tenant.get("/v1/threads:checkpoints",
                                      params={**params, **({"cursor": cursor} if cursor else {})})
            assert answer.status_code == 200, answer.text
            page = answer.json()
            seen += [(c["checkpoint_id"], c["thread_id"]) for c in page["checkpoints"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return seen

    assert listing(limit=700) == expected
    assert listing(limit=333, before="000050") == [row for row in expected if row[0] < "000050"]


def _plans_of(database_url: str, tenant_id: str, cases: list[dict[str, Any]], *, drop: bool) -> list[Any]:
    return asyncio.run(_plans(database_url, tenant_id, cases, drop=drop))



def test_a_threads_listing_is_a_backward_scan_of_its_primary_key_from_its_cursor(
    fresh_tenant: httpx.Client, database_url: str
) -> None:
    """Whatever bounds a page of one namespace has (`before`, the cursor, both), they bound the primary key's scan
    (Index Cond), in the generic plan too: a page never scans the thread's newer checkpoints and drops them."""
    run = uuid.uuid4().hex[:8]
    tenant_id = _tenant_of_a_first_thread(fresh_tenant, database_url, run)
    rows = _seed(database_url, tenant_id, run)
    sql(database_url, "ANALYZE thread_checkpoints")  # what autovacuum would know of the tenant's many threads
    thread = rows[0][1]
    ids = [checkpoint_id for checkpoint_id, t in rows if t == thread]  # newest first

    after = {"checkpoint_id": "000070"}
    cases = [
        {"checkpoint_ns": "", "before": None, "after": None, "limit": 11},
        {"checkpoint_ns": "", "before": "000050", "after": None, "limit": 11},
        {"checkpoint_ns": "", "before": None, "after": after, "limit": 11},
        {"checkpoint_ns": "", "before": "000090", "after": after, "limit": 11},
    ]
    bound = "((checkpoint_id)::text < "
    bounds = [[], [bound], [bound], [bound]]
    plans = asyncio.run(_plans(database_url, tenant_id, cases, drop=False, thread_id=thread))
    for (custom, generic), wanted in zip(plans, bounds, strict=True):
        _assert_index_serves(custom, wanted, "pk_thread_checkpoints")
        _assert_index_serves(generic, wanted, "pk_thread_checkpoints")

    def listing(**params: Any) -> list[str]:
        seen: list[str] = []
        cursor = None
        while True:
            answer = fresh_tenant.get(f"/v1/threads/{thread}/checkpoints", params={
                "checkpoint_ns": "", **params, **({"cursor": cursor} if cursor else {})})
            assert answer.status_code == 200, answer.text
            page = answer.json()
            seen += [c["checkpoint_id"] for c in page["checkpoints"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return seen

    assert listing(limit=7) == ids
    assert listing(limit=9, before="000050") == [i for i in ids if i < "000050"]
