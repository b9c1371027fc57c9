"""Retrieval latency for the DeLLM context policy, and why it is an exact scan rather than an approximate index.

`python -m bench.retrieval_bench [--sizes 1000 10000] [--others 100000] [--repeats 20] [--database-url URL]`

Loads `--others` messages spread over 100 other sessions, then one session of each size (random unit vectors, 384
dimensions, as all-MiniLM-L6-v2 gives), and times the runtime's own retrieval query (`nearest_messages`, top 5,
min_similarity -1 so every query has 5 candidates), which scans the session's rows found by the session index. Then
it builds an HNSW index over every session's vectors (pgvector, cosine, default ef_search 40) and asks the same
question through it, as an approximate index would be used: median latency, how many of the 5 rows it returned, and
how many of them were the true top 5. Random vectors are an approximate index's hard case (no clusters); what this
shows regardless of the data is that a global index filtered to one session can return fewer than k rows. Medians
over `--repeats` random queries. Without `--database-url` an embedded PostgreSQL starts in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from app.db.database import Database
from app.db.embedded import start_embedded_postgres
from app.db.migrate import upgrade_to_head_async
from app.ids import new_id
from app.keys.content import Sealer
from app.keys.keyring import Keyring
from app.keys.leaves import Leaves
from app.keys.local import LocalProvider
from app.runtime.retrieval import CONTEXT_KINDS
from app.sessions.repositories import artifact_search as repo
from app.tenants.service import TenantService

DIMS = 384
TOP_K = 5


def unit(rng: random.Random) -> list[float]:
    v = [rng.gauss(0.0, 1.0) for _ in range(DIMS)]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


def literal(v: list[float]) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


async def new_session(conn: asyncpg.Connection, tenant_id: str, n: int) -> str:
    """A retrieval session row of `n` turns, with no artifacts yet."""
    session_id = new_id("ses")
    await conn.execute("INSERT INTO sessions (id, tenant_id, epoch, status, context_policy, checkpoint_policy, "
                       "retrieval, tools, sampling, turns, token_count) VALUES ($1, $2, 0, 'idle', 'retrieval', "
                       "'every_turn', '{}', '[]', '{}', $3, $4)", session_id, tenant_id, n, n)
    return session_id


async def load(conn: asyncpg.Connection, tenant_id: str, n: int, rng: random.Random,
               vectors: list[str] | None = None) -> str:
    """A session of `n` user messages in the clear (as before sealing): random unit vectors, or `vectors` (pgvector
    literals) in log order."""
    session_id = await new_session(conn, tenant_id, n)
    rows: list[tuple[Any, ...]] = [
        (new_id("art"), tenant_id, session_id, i, "user", i + 1, "m", i, i + 1, [1], [], False, "{}",
         vectors[i] if vectors is not None else literal(unit(rng)))
        for i in range(n)
    ]
    await conn.executemany(
        "INSERT INTO artifacts (id, tenant_id, session_id, position, kind, turn, content, token_start, token_end, "
        "token_ids, source_ids, committed, meta, embedding) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, "
        "$12, $13::jsonb, $14::vector)", rows,
    )
    return session_id


Answers = list[list[str]]


async def exact_ms(
    db: Database, sealer: Sealer, session_id: str, queries: list[list[float]], turn: int
) -> tuple[float, Answers]:
    times: list[float] = []
    answers: Answers = []
    for q in queries:
        start = time.perf_counter()
        async with db.transaction() as tx:
            found = await repo.nearest_messages(tx, sealer, session_id, q, kinds=CONTEXT_KINDS, before_turn=turn,
                                                top_k=TOP_K, min_similarity=-1.0)
        times.append((time.perf_counter() - start) * 1000)
        answers.append([n.id for n in found])
    return statistics.median(times), answers


async def hnsw_ms(conn: asyncpg.Connection, session_id: str, queries: list[list[float]]) -> tuple[float, Answers]:
    times: list[float] = []
    answers: Answers = []
    for q in queries:
        start = time.perf_counter()
        rows = await conn.fetch("SELECT id FROM artifacts WHERE session_id = $1 ORDER BY embedding <=> $2::vector "
                                "LIMIT $3", session_id, literal(q), TOP_K)
        times.append((time.perf_counter() - start) * 1000)
        answers.append([r["id"] for r in rows])
    return statistics.median(times), answers


async def main(sizes: list[int], others: int, repeats: int, url: str | None) -> None:
    rng = random.Random(0)
    if url is None:
        url = start_embedded_postgres(Path(tempfile.mkdtemp(prefix="lethe-retrievalbench-")))
    await upgrade_to_head_async(url)
    conn = await asyncpg.connect(url)
    db = Database(url, pool_size=2)
    # The runtime's query takes the process's Sealer; these rows are in the clear (no leaf), so it opens nothing,
    # but one must be given (bench/sealing_retrieval.py compares with sealed rows).
    keys = Path(tempfile.mkdtemp(prefix="lethe-retrievalbench-keys-"))
    sealer = Sealer(Keyring(LocalProvider(keys)), Leaves(TenantService(db).reserve_leaves))
    tenant_id = new_id("ten")
    await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, $2)", tenant_id, "bench-" + tenant_id)
    try:
        for _ in range(100):
            await load(conn, tenant_id, others // 100, rng)
        sessions = {n: await load(conn, tenant_id, n, rng) for n in sizes}
        await conn.execute("ANALYZE artifacts")
        queries = [unit(rng) for _ in range(repeats)]
        exact = {n: await exact_ms(db, sealer, sessions[n], queries, n + 1) for n in sizes}
        await conn.execute("CREATE INDEX bench_hnsw ON artifacts USING hnsw (embedding vector_cosine_ops)")
        await conn.execute("ANALYZE artifacts")
        print(f"{'messages':>9} {'others':>7} {'exact ms':>9} {'hnsw ms':>8} {'hnsw rows/k':>12} {'hnsw recall':>12}")
        for n in sizes:
            exact_time, truth = exact[n]
            approx_time, got = await hnsw_ms(conn, sessions[n], queries)
            rows = statistics.mean(len(g) for g in got) / TOP_K
            recall = statistics.mean(len(set(g) & set(t)) / TOP_K for g, t in zip(got, truth, strict=True))
            print(f"{n:>9} {others:>7} {exact_time:>9.2f} {approx_time:>8.2f} {rows:>12.2f} {recall:>12.2f}")
    finally:
        await conn.execute("DROP INDEX IF EXISTS bench_hnsw")
        await db.close()
        await conn.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--others", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    asyncio.run(main(args.sizes, args.others, args.repeats, args.database_url))
