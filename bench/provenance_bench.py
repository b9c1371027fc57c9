"""Taint-closure latency: the recursive CTE in PostgreSQL against networkx in memory, at 1k, 10k and 100k artifacts.

`python -m bench.provenance_bench [--sizes 1000 10000 100000] [--repeats 5] [--database-url URL]`

Each size is one session shaped like the runtime writes it: a system block, then alternating user messages and
replies, with the full policy's reduced edges (a reply's parents: the message before it and the previous reply).
Closures are asked from three roots: the first user message (the worst case: it reaches every later reply), one in
the middle, and one near the end. networkx is timed twice: the query on a graph already in memory, and with the
edge load from the database that a process without a cached graph pays first. Medians over `--repeats`.
Without `--database-url` an embedded PostgreSQL starts in a temporary directory. Replies' `source_ids` are left
empty here (the CTE never reads them), which keeps loading 100k artifacts linear.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from app.db.database import Database
from app.db.embedded import start_embedded_postgres
from app.db.migrate import upgrade_to_head_async
from app.ids import new_id
from app.sessions.repositories import artifacts as repo


async def load_session(conn: asyncpg.Connection, tenant_id: str, n_artifacts: int) -> tuple[str, list[str]]:
    session_id = new_id("ses")
    await conn.execute("INSERT INTO sessions (id, tenant_id, epoch, status, context_policy, checkpoint_policy, "
                       "retrieval, tools, sampling, turns, token_count) VALUES ($1, $2, 0, 'idle', 'full', "
                       "'every_turn', '{}', '[]', '{}', $3, $4)", session_id, tenant_id, n_artifacts // 2,
                       n_artifacts * 10)
    ids = [new_id("art") for _ in range(n_artifacts)]
    artifacts: list[tuple[Any, ...]] = []
    edges: list[tuple[str, str, str, int]] = []
    previous_reply: str | None = None
    for i, artifact_id in enumerate(ids):
        kind = "system" if i == 0 else ("user" if i % 2 == 1 else "assistant")
        turn = (i + 1) // 2
        sources = [] if kind == "assistant" else [artifact_id]
        artifacts.append((artifact_id, tenant_id, session_id, i, kind, turn, "x", i * 10, i * 10 + 10, [1] * 10,
                          sources, False, "{}"))
        if kind == "assistant":
            parents = [ids[i - 1]] + ([previous_reply] if previous_reply else [ids[0]])
            edges.extend((session_id, parent, artifact_id, turn) for parent in parents)
            previous_reply = artifact_id
    columns = ["id", "tenant_id", "session_id", "position", "kind", "turn", "content", "token_start", "token_end",
               "token_ids", "source_ids", "committed", "meta"]
    await conn.copy_records_to_table("artifacts", records=artifacts, columns=columns)
    await conn.copy_records_to_table("provenance_edges", records=edges,
                                     columns=["session_id", "parent_id", "child_id", "turn"])
    await conn.execute("ANALYZE artifacts; ANALYZE provenance_edges")
    return session_id, ids


async def median_ms(fn: Callable[[], Awaitable[object]], repeats: int) -> tuple[float, object]:
    await fn()  # warm: connection, plan and buffer caches
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = await fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), result


async def measure(db: Database, conn: asyncpg.Connection, nx: Any, tenant_id: str, session_id: str, root: str,
                  repeats: int) -> tuple[int, float, float, float, float]:
    """(closure size, CTE ms, networkx query ms, networkx load+query ms, τ ms) for one root."""

    async def cte() -> list[str]:
        async with db.transaction() as tx:
            return await repo.closure_ids(tx, session_id, root)

    async def tau() -> int | None:
        async with db.transaction() as tx:
            return await repo.first_entry(tx, tenant_id, session_id, [root])

    cte_ms, closure = await median_ms(cte, repeats)
    tau_ms, _ = await median_ms(tau, repeats)
    assert isinstance(closure, list)
    if nx is None:
        return len(closure), cte_ms, float("nan"), float("nan"), tau_ms

    async def load_graph() -> Any:
        rows = await conn.fetch("SELECT parent_id, child_id FROM provenance_edges WHERE session_id = $1", session_id)
        graph = nx.DiGraph()
        graph.add_edges_from((r["parent_id"], r["child_id"]) for r in rows)
        return graph

    graph = await load_graph()

    async def query() -> Any:
        return nx.descendants(graph, root)

    async def load_and_query() -> Any:
        return nx.descendants(await load_graph(), root)

    nx_query, reached = await median_ms(query, repeats)
    nx_total, _ = await median_ms(load_and_query, repeats)
    assert set(closure) == {root, *reached}  # type: ignore[misc]  # both ways find the same closure
    return len(closure), cte_ms, nx_query, nx_total, tau_ms


async def main(sizes: list[int], repeats: int, url: str | None) -> None:
    try:
        import networkx as nx
    except ImportError:  # not a dependency of the service: the benchmark then reports the CTE only
        nx = None
    if url is None:
        url = start_embedded_postgres(Path(tempfile.mkdtemp(prefix="lethe-provbench-")))
    await upgrade_to_head_async(url)
    conn = await asyncpg.connect(url)
    db = Database(url, pool_size=2)
    tenant_id = new_id("ten")
    await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, $2)", tenant_id, "bench-" + tenant_id)
    print(f"{'artifacts':>9} {'root':>6} {'closure':>8} {'cte ms':>8} {'nx query ms':>12} {'nx load+query ms':>17}"
          f" {'tau ms':>7}")
    try:
        for n in sizes:
            session_id, ids = await load_session(conn, tenant_id, n)
            for label, root in (("first", ids[1]), ("middle", ids[(n // 2) | 1]), ("late", ids[n - 3])):
                size, cte_ms, nx_query, nx_total, tau_ms = await measure(
                    db, conn, nx, tenant_id, session_id, root, repeats
                )
                print(f"{n:>9} {label:>6} {size:>8} {cte_ms:>8.2f} {nx_query:>12.2f} {nx_total:>17.2f} {tau_ms:>7.2f}")
            await conn.execute("DELETE FROM sessions WHERE id = $1", session_id)
    finally:
        await db.close()
        await conn.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    asyncio.run(main(args.sizes, args.repeats, args.database_url))
