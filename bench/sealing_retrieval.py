"""Retrieval top-k with embeddings sealed at rest (ranked in the process) against the old plaintext pgvector scan.

`python -m bench.sealing_retrieval [--sizes 1000 10000] [--others 20000] [--repeats 20] [--database-url URL]`

One database (an embedded PostgreSQL in a temporary directory without `--database-url`), one run. Per size it loads
two sessions of the same random unit 384-dimension float32 vectors, one message each (bench/retrieval_bench.py's
loaders), beside `--others` messages over 100 other sessions:
- **sealed**, as the live code stores them now: rows built as the runtime builds them and passed through
  `sealing.seal_rows` (each artifact under a leaf of its session's stream, text, tokens and embedding AES-256-GCM
  sealed), with a real `Sealer` over the `local` key provider in a temporary directory; queried with the runtime's
  own `artifact_search.nearest_messages` (top 5, min_similarity -1), which reads the candidates without their
  ciphertexts, opens only the vectors its `Sealer` has not opened yet at that row version (one AES-GCM call each,
  then kept by the `Sealer`, `recall`), ranks them with numpy, and opens the top 5 texts;
- **clear**, as before sealing (`be86ddb`): the same vectors in the pgvector column, queried with the old
  `nearest_messages` statement (ranked by PostgreSQL: `ORDER BY embedding <=> :q, position LIMIT 5`), copied here.
Both return the same 5 positions for every query (checked). Timed: `--repeats` random queries each, median and p95,
`warm` (an untimed query first: the keyring's caches and the opened vectors filled, as for a session ranked turn
after turn) and, for sealed, `cold` (a fresh `Sealer` and `Keyring` before every query, as a new process or a cache
past its time to live: every cover read from the key store, every leaf's key derived and every vector opened again).
The clear path has no process cache (PostgreSQL's buffers are warm for both).
Then, for the record, where a query that opens every vector spends its time (the path before the opened vectors
were kept), each stage timed alone: fetching the rows with their ciphertexts, opening the vectors (`open_vector`:
keyring lookup + AES-GCM, one call per vector), numpy (matrix, norms, product), the Python sort of the candidates,
and opening the top 5 texts; beside the bare AES-GCM opens with the AEADs in hand (`envelope.unseal`), and the same
vectors decrypted in blocks of 256 with one AEAD (`--block`, the design the doc weighed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.db.embedded import start_embedded_postgres
from app.db.migrate import upgrade_to_head_async
from app.db.models import Artifact
from app.ids import new_id
from app.keys import envelope
from app.keys.content import Sealer
from app.keys.envelope import Binding
from app.keys.keyring import Keyring
from app.keys.leaves import Leaves
from app.keys.local import LocalProvider
from app.runtime.retrieval import CONTEXT_KINDS
from app.sessions.repositories import artifact_search as repo
from app.sessions.repositories.sealing import binding, open_text, open_vector, seal_rows
from app.tenants.service import TenantService
from bench.retrieval_bench import DIMS, TOP_K, load, new_session
from bench.serve import stop_postgres

BLOCK = 256


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    vectors = rng.standard_normal((n, DIMS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def literal32(v: np.ndarray) -> str:
    """A pgvector literal holding exactly these float32 values (repr of each round-trips)."""
    return "[" + ",".join(repr(x) for x in v.tolist()) + "]"


async def load_sealed(conn: asyncpg.Connection, sealer: Sealer, tenant_id: str, vectors: np.ndarray) -> str:
    """A session of one user message per vector, stored as the runtime stores them now (`seal_rows`)."""
    n = len(vectors)
    session_id = await new_session(conn, tenant_id, n)
    rows = [
        {"id": new_id("art"), "tenant_id": tenant_id, "session_id": session_id, "position": i, "kind": "user",
         "turn": i + 1, "content": "m", "token_start": i, "token_end": i + 1, "token_ids": [1], "source_ids": [],
         "committed": False, "meta": {}, "embedding": vectors[i].tolist()}
        for i in range(n)
    ]
    sealed = await seal_rows(sealer, rows)
    await conn.executemany(
        "INSERT INTO artifacts (id, tenant_id, session_id, position, kind, turn, content, content_sealed, token_start, "
        "token_end, token_ids, token_ids_sealed, source_ids, committed, meta, meta_sealed, embedding_sealed, leaf) "
        "VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8, $9, NULL, $10, $11, $12, $13::jsonb, $14, $15, $16)",
        [(r["id"], r["tenant_id"], r["session_id"], r["position"], r["kind"], r["turn"], r["content_sealed"],
          r["token_start"], r["token_end"], r["token_ids_sealed"], r["source_ids"], r["committed"],
          json.dumps(r["meta"] or {}), r.get("meta_sealed"), r["embedding_sealed"], r["leaf"]) for r in sealed],
    )
    return session_id


def _where(session_id: str, before_turn: int) -> list[Any]:
    return [Artifact.session_id == session_id, Artifact.archived_by.is_(None),
            Artifact.kind.in_(list(CONTEXT_KINDS)), Artifact.turn < before_turn]


async def old_nearest(db: AsyncSession, _sealer: Sealer, session_id: str, vector: list[float], before_turn: int
                      ) -> list[int]:
    """The positions be86ddb's `nearest_messages` returned: PostgreSQL ranks (`<=>`, ties in log order, LIMIT k)."""
    distance = Artifact.embedding.cosine_distance(vector)
    stmt = (
        select(Artifact.id, Artifact.kind, Artifact.turn, Artifact.position, Artifact.content, Artifact.source_ids,
               (1.0 - distance).label("similarity"))
        .where(*_where(session_id, before_turn), Artifact.embedding.is_not(None), distance <= 1.0 - -1.0)
        .order_by(distance, Artifact.position)
        .limit(TOP_K)
    )
    return [r.position for r in (await db.execute(stmt)).all()]


async def new_nearest(db: AsyncSession, sealer: Sealer, session_id: str, vector: list[float], before_turn: int
                      ) -> list[int]:
    found = await repo.nearest_messages(db, sealer, session_id, vector, kinds=CONTEXT_KINDS, before_turn=before_turn,
                                        top_k=TOP_K, min_similarity=-1.0)
    return [n.position for n in found]


Query = Callable[[AsyncSession, Sealer, str, list[float], int], Awaitable[list[int]]]


async def timed(db: Database, sealer: Sealer, query: Query, session_id: str, q: list[float], before_turn: int
                ) -> tuple[float, list[int]]:
    start = time.perf_counter()
    async with db.transaction() as tx:
        found = await query(tx, sealer, session_id, q, before_turn)
    return (time.perf_counter() - start) * 1000, found


async def stages(db: Database, sealer: Sealer, session_id: str, q: list[float], before_turn: int) -> dict[str, float]:
    """One sealed query that opens every vector (the path before the `Sealer` kept them), step by step (ms per step)."""
    out: dict[str, float] = {}
    async with db.transaction() as tx:
        t0 = time.perf_counter()
        stmt = select(
            Artifact.id, Artifact.tenant_id, Artifact.kind, Artifact.turn, Artifact.position, Artifact.source_ids,
            Artifact.content, Artifact.content_sealed, Artifact.embedding, Artifact.embedding_sealed,
        ).where(*_where(session_id, before_turn), repo._EMBEDDED).order_by(Artifact.position)
        rows = (await tx.execute(stmt)).all()
        t1 = time.perf_counter()
        vectors = [await open_vector(sealer, r.tenant_id, r.id, r.embedding, r.embedding_sealed) for r in rows]
        t2 = time.perf_counter()
        matrix = np.asarray(vectors, dtype=np.float64)
        query = np.asarray(q, dtype=np.float64)
        norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(query)
        similarity = np.clip(matrix @ query / norms, -1.0, 1.0)
        t3 = time.perf_counter()
        order = sorted((i for i in range(len(rows)) if 1.0 - similarity[i] <= 2.0),
                       key=lambda i: (1.0 - similarity[i], rows[i].position))[:TOP_K]
        t4 = time.perf_counter()
        for i in order:
            await open_text(sealer, rows[i].tenant_id, rows[i].id, rows[i].content, rows[i].content_sealed)
        t5 = time.perf_counter()
        # the bare AES-GCM opens, the AEADs (the cached keys) in hand
        aeads = [await sealer.keyring.cipher(r.tenant_id, envelope.leaf(r.embedding_sealed)) for r in rows]
        t6 = time.perf_counter()
        for aead, r in zip(aeads, rows, strict=True):
            envelope.unseal(aead, binding(r.tenant_id, r.id, "embedding"), r.embedding_sealed)
        t7 = time.perf_counter()
    for name, seconds in [("fetch rows", t1 - t0), ("open vectors", t2 - t1), ("numpy", t3 - t2),
                          ("sort", t4 - t3), ("open top texts", t5 - t4), ("bare AES-GCM", t7 - t6)]:
        out[name] = seconds * 1000
    return out


def blocks_ms(vectors: np.ndarray, repeats: int, block: int) -> float:
    """Median ms to decrypt `vectors` sealed in blocks of `block` (one AEAD, as the doc's redesign would)."""
    aead = envelope.cipher(bytes(32))
    sealed = [(Binding("ten_bench", "embedding_blocks", str(i), "embedding"),
               envelope.seal(aead, i, Binding("ten_bench", "embedding_blocks", str(i), "embedding"),
                             vectors[i : i + block].tobytes()))
              for i in range(0, len(vectors), block)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matrix = np.frombuffer(b"".join(envelope.unseal(aead, b, c) for b, c in sealed), dtype=np.float32)
        times.append((time.perf_counter() - start) * 1000)
        assert matrix.size == vectors.size
    return statistics.median(times)


def summary(values: Sequence[float]) -> tuple[float, float]:
    return statistics.median(values), float(np.percentile(values, 95))


async def main(sizes: list[int], others: int, repeats: int, url: str | None, block: int) -> None:
    load_before = os.getloadavg()
    rng, np_rng = random.Random(0), np.random.default_rng(0)
    own = None if url else Path(tempfile.mkdtemp(prefix="lethe-sealretrieval-"))
    if own is not None:
        url = start_embedded_postgres(own)
    assert url is not None
    await upgrade_to_head_async(url)
    conn = await asyncpg.connect(url)
    db = Database(url, pool_size=2)
    keys = Path(tempfile.mkdtemp(prefix="lethe-sealretrieval-keys-"))
    tenants = TenantService(db)

    def fresh() -> Sealer:  # a new process's keyring: empty cover and key caches, the same key store
        return Sealer(Keyring(LocalProvider(keys)), Leaves(tenants.reserve_leaves))

    sealer = fresh()
    tenant_id = new_id("ten")
    await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, $2)", tenant_id, "bench-" + tenant_id)
    results: dict[int, dict[str, Any]] = {}
    try:
        for _ in range(100 if others else 0):
            await load(conn, tenant_id, others // 100, rng)
        data = {n: unit_vectors(np_rng, n) for n in sizes}
        clear = {n: await load(conn, tenant_id, n, rng, [literal32(v) for v in data[n]]) for n in sizes}
        sealed = {n: await load_sealed(conn, sealer, tenant_id, data[n]) for n in sizes}
        await conn.execute("ANALYZE artifacts")
        queries = [[float(x) for x in v] for v in unit_vectors(np_rng, repeats)]
        for n in sizes:
            turn = n + 1
            await timed(db, sealer, old_nearest, clear[n], queries[0], turn)  # untimed: plans and buffers warm
            await timed(db, sealer, new_nearest, sealed[n], queries[0], turn)  # untimed: fills the keyring's caches
            r: dict[str, Any] = {"clear": [], "warm": [], "cold": [], "stages": []}
            for q in queries:
                ms, truth = await timed(db, sealer, old_nearest, clear[n], q, turn)
                r["clear"].append(ms)
                ms, got = await timed(db, sealer, new_nearest, sealed[n], q, turn)
                r["warm"].append(ms)
                assert got == truth, f"sealed top-{TOP_K} {got} differs from the clear scan's {truth}"
                r["stages"].append(await stages(db, sealer, sealed[n], q, turn))
            for q in queries:
                ms, _ = await timed(db, fresh(), new_nearest, sealed[n], q, turn)
                r["cold"].append(ms)
            r["blocks"] = blocks_ms(data[n], repeats, block)
            results[n] = r
    finally:
        await db.close()
        await conn.close()
        if own is not None:
            stop_postgres(own / "pg")
            shutil.rmtree(own, ignore_errors=True)
        shutil.rmtree(keys, ignore_errors=True)
    load_after = os.getloadavg()

    print(f"retrieval top-{TOP_K}, {repeats} queries per figure, one session each, {others} other messages in the "
          f"table; {os.cpu_count()} cores, load average before "
          + " ".join(f"{x:.2f}" for x in load_before) + ", after " + " ".join(f"{x:.2f}" for x in load_after))
    print(f"\n{'messages':>9} | {'clear pgvector':>16} | {'sealed warm':>16} | {'sealed cold':>16} | "
          f"{'warm / clear':>12} | {'cold / clear':>12}")
    print(f"{'':>9} | {'median / p95 ms':>16} | {'median / p95 ms':>16} | {'median / p95 ms':>16} | "
          f"{'medians':>12} | {'medians':>12}")
    for n, r in results.items():
        c, w, k = summary(r["clear"]), summary(r["warm"]), summary(r["cold"])
        print(f"{n:>9} | {c[0]:7.2f} / {c[1]:6.2f} | {w[0]:7.2f} / {w[1]:6.2f} | {k[0]:7.2f} / {k[1]:6.2f} | "
              f"{w[0] / c[0]:>11.1f}x | {k[0] / c[0]:>11.1f}x")
    names = list(results[sizes[0]]["stages"][0])
    print(f"\na sealed query opening every vector (the path before the opened vectors were kept), step by step "
          f"(medians, ms): {', '.join(names)}")
    for n, r in results.items():
        med = {name: statistics.median(s[name] for s in r["stages"]) for name in names}
        steps = sum(v for name, v in med.items() if name != "bare AES-GCM")
        print(f"  {n:>6}: " + ", ".join(f"{name} {v:.2f}" for name, v in med.items())
              + f"; steps add up to {steps:.2f} (cold query median {statistics.median(r['cold']):.2f})")
        print(f"          per vector: open_vector {1000 * med['open vectors'] / n:.1f} µs, bare AES-GCM "
              f"{1000 * med['bare AES-GCM'] / n:.1f} µs; opens are {100 * med['open vectors'] / steps:.0f} % of the "
              f"query; the same vectors in blocks of {block}: {r['blocks']:.2f} ms to decrypt (estimate of the "
              f"redesign: the query less {med['open vectors'] - r['blocks']:.2f} ms, about "
              f"{steps - med['open vectors'] + r['blocks']:.2f} ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--others", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--block", type=int, default=BLOCK)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    asyncio.run(main(args.sizes, args.others, args.repeats, args.database_url, args.block))
