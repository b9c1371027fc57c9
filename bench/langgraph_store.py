"""LangGraph store round trips: LetheStore over HTTP vs LangGraph's own PostgresStore, side by side in one run, on the
same embedded PostgreSQL (the one the Lethe server uses; PostgresStore's tables in a schema of their own).

    # a server (embedded PostgreSQL in its data dir), then its database URL:
    LETHE_PORT=18745 LETHE_DATA_DIR=/tmp/lgs-bench LETHE_BOOTSTRAP_API_KEY=<key> .venv/bin/lethe serve &
    .venv/bin/python -c "from pathlib import Path; from app.db.embedded import start_embedded_postgres as s; \
        print(s(Path('/tmp/lgs-bench')))"
    clients/python/.venv/bin/python bench/langgraph_store.py --url http://127.0.0.1:18745 --key <key> \
        --database-url 'postgresql://postgres:@/postgres?host=/tmp/lgs-bench/pg' [--iterations 300] [--items 100]

Both stores first hold the same `--items` items in one namespace (`{"text", "kind", "n"}`), then each iteration, for
both stores in turn: `put` of one item (an update of an existing key), `get` of one, `search` with a filter (no
query: what a store does without embeddings), and `search` with a query (semantic). Sync stores, one connection each
(httpx keep-alive; one psycopg connection): latency of one call, median and p99 after a warm-up. Beside them, in the
same iterations, the floor of any LetheStore call: a bare `GET /v1/memory/{namespace}/{key}` of the same record with
httpx (no LangGraph, no store), and its ratio to PostgresStore's `get`.

The semantic search is not the same work on both sides: Lethe embeds the query with its model (all-MiniLM-L6-v2 on the
server's CPU) and ranks the namespace in the process, while PostgresStore is given a cheap hashing embedder here (the
client venv has no sentence-transformers) and ranks in pgvector. Its ratio says what Lethe's real query embedding
costs; the filter search is the like-for-like figure. Imports nothing of the server.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
from langgraph.store.base import BaseStore
from langgraph.store.postgres import PostgresStore
from lethe_client.langgraph import LetheStore
from lethe_client.langgraph.store import key_name, namespace_name
from psycopg import Connection
from psycopg.rows import dict_row

SCHEMA = "langgraph_store_bench"
DIMS = 384
WORDS = [
    "apple", "car", "dog", "river", "mountain", "music", "coffee", "garden", "train", "book", "ocean", "city",
    "winter", "game", "paint",
]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def hashing_embed(texts: list[str]) -> list[list[float]]:
    """A bag of hashed words, unit length: cheap and deterministic (PostgresStore's side of the semantic search)."""
    out = []
    for text in texts:
        vector = [0.0] * DIMS
        for word in text.lower().split():
            vector[int(hashlib.blake2b(word.encode(), digest_size=4).hexdigest(), 16) % DIMS] += 1.0
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        out.append([x / norm for x in vector])
    return out


def _value(n: int) -> dict[str, Any]:
    words = " ".join(WORDS[(n * 7 + i) % len(WORDS)] for i in range(8))
    return {"text": f"note {n}: {words}", "kind": "even" if n % 2 == 0 else "odd", "n": n}


def _timed(fn: Callable[[], Any], into: list[float]) -> None:
    started = time.perf_counter()
    fn()
    into.append((time.perf_counter() - started) * 1000)


def _bare_get(client: httpx.Client, path: str) -> None:
    client.get(path).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--database-url", required=True, help="the Lethe server's PostgreSQL")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--items", type=int, default=100, help="items in the searched namespace")
    args = parser.parse_args()

    with Connection.connect(args.database_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    conn = Connection.connect(args.database_url, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                              options=f"-c search_path={SCHEMA},public")
    index: Any = {"dims": DIMS, "embed": hashing_embed, "fields": ["text"]}
    postgres = PostgresStore(conn, index=index)
    postgres.setup()
    run = uuid.uuid4().hex[:8]
    lethe = LetheStore(args.url, args.key, scope=(f"bench{run}",), index={"fields": ["text"]})
    stores: dict[str, BaseStore] = {"LetheStore": lethe, "PostgresStore": postgres}
    ns = ("bench", run)
    for store in stores.values():
        for n in range(args.items):
            store.put(ns, f"k{n}", _value(n))

    ops = ("put", "get", "search filter", "search query")
    timings: dict[str, dict[str, list[float]]] = {name: {op: [] for op in ops} for name in stores}
    bare = httpx.Client(base_url=args.url, headers={"Authorization": f"Bearer {args.key}"})
    floor: list[float] = []
    for i in range(args.warmup + args.iterations):
        n = i % args.items
        query = f"{WORDS[i % len(WORDS)]} {WORDS[(i * 3) % len(WORDS)]} {i}"  # never the same twice: no cache hit
        for name, store in stores.items():  # interleaved: both see the same machine at the same moment
            calls: dict[str, Callable[[], Any]] = {
                "put": partial(store.put, ns, f"k{n}", _value(n + i)),
                "get": partial(store.get, ns, f"k{(n * 13) % args.items}"),
                "search filter": partial(store.search, ns, filter={"kind": "even"}, limit=10),
                "search query": partial(store.search, ns, query=query, limit=10),
            }
            for op, call in list(calls.items())[:2]:
                spent: list[float] = []
                _timed(call, spent)
                if i >= args.warmup:
                    timings[name][op] += spent
            if name == "LetheStore":  # right after its get: the server in the state the get found it in
                path = f"/v1/memory/{namespace_name(lethe.scope, ns)}/{key_name(f'k{(n * 13) % args.items}')}"
                spent = []
                _timed(partial(_bare_get, bare, path), spent)
                if i >= args.warmup:
                    floor += spent
            for op, call in list(calls.items())[2:]:
                spent = []
                _timed(call, spent)
                if i >= args.warmup:
                    timings[name][op] += spent

    print(f"{args.iterations} iterations after {args.warmup} warm-up, {args.items} items in the namespace")
    print(f"{'store':<15}{'op':<15}{'median ms':>10}{'p99 ms':>10}")
    for name, by_op in timings.items():
        for op, values in by_op.items():
            print(f"{name:<15}{op:<15}{statistics.median(values):>10.3f}{_percentile(values, 0.99):>10.3f}")
    for op in ops:
        lethe_ms, pg_ms = timings["LetheStore"][op], timings["PostgresStore"][op]
        print(f"ratio {op:<14} median {statistics.median(lethe_ms) / statistics.median(pg_ms):.2f}x  "
              f"p99 {_percentile(lethe_ms, 0.99) / _percentile(pg_ms, 0.99):.2f}x")
    pg_get = statistics.median(timings["PostgresStore"]["get"])
    print(f"floor: a bare HTTP GET of the record {statistics.median(floor):.3f} ms median, "
          f"{_percentile(floor, 0.99):.3f} ms p99: {statistics.median(floor) / pg_get:.2f}x PostgresStore's get")
    for store in stores.values():
        for n in range(args.items):
            store.delete(ns, f"k{n}")
    lethe.close()
    bare.close()
    conn.close()


if __name__ == "__main__":
    main()
