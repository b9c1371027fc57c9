"""LangGraph checkpointer round trips: LetheSaver over HTTP vs LangGraph's own PostgresSaver, side by side in one run,
on the same embedded PostgreSQL (the one the Lethe server uses; PostgresSaver's tables in a schema of their own, as
Lethe has a `checkpoints` table of its own).

    # a server (embedded PostgreSQL in its data dir), then its database URL:
    LETHE_PORT=18744 LETHE_DATA_DIR=/tmp/lg-bench LETHE_BOOTSTRAP_API_KEY=<key> .venv/bin/lethe serve &
    .venv/bin/python -c "from pathlib import Path; from app.db.embedded import start_embedded_postgres as s; \
        print(s(Path('/tmp/lg-bench')))"
    clients/python/.venv/bin/python bench/langgraph_saver.py --url http://127.0.0.1:18744 --key <key> \
        --database-url 'postgresql://postgres:@/postgres?host=/tmp/lg-bench/pg' [--iterations 500]

Each iteration, for both savers in turn: `put` of the next checkpoint of a chat thread (a `messages` channel of
LangChain messages, grown by one message a step, written as a new channel version, as a graph's super-step does) and
`get_tuple` of the thread's latest checkpoint (what a run loads first). Sync savers, one connection each (httpx
keep-alive; one psycopg connection): the latency of one round trip, median and p99 over the iterations after a
warm-up; the ratio LetheSaver / PostgresSaver is the figure the goal (within 2x) is about. The thread is truncated
to `--window` messages so both savers move the same bytes every step.

Run with the client's venv (langgraph-checkpoint-postgres and psycopg come with the `test` extra); it imports nothing
of the server.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from lethe_client.langgraph import LetheSaver
from psycopg import Connection
from psycopg.rows import dict_row

SCHEMA = "langgraph_bench"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Thread:
    """One chat thread's checkpoints, identical for both savers."""

    def __init__(self, saver: BaseCheckpointSaver[Any], window: int) -> None:
        self.saver, self.window = saver, window
        self.config: dict[str, Any] = {"configurable": {"thread_id": f"bench-{uuid.uuid4().hex}", "checkpoint_ns": ""}}
        self.messages: list[Any] = []
        self.version: Any = None
        self.step = 0

    def put(self) -> None:
        self.step += 1
        cls = HumanMessage if self.step % 2 else AIMessage
        self.messages = [*self.messages, cls(content=f"message {self.step}: " + "lorem ipsum " * 15,
                                              id=str(uuid.uuid4()))][-self.window:]
        self.version = self.saver.get_next_version(self.version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": self.messages}
        checkpoint["channel_versions"] = {"messages": self.version}
        checkpoint["versions_seen"] = {"agent": {"messages": self.version}}
        self.config = self.saver.put(self.config, checkpoint, {"source": "loop", "step": self.step, "parents": {}},
                                     {"messages": self.version})

    def get(self) -> None:
        latest = {"configurable": {k: v for k, v in self.config["configurable"].items() if k != "checkpoint_id"}}
        found = self.saver.get_tuple(latest)
        assert found is not None and len(found.checkpoint["channel_values"]["messages"]) == len(self.messages)


def _timed(fn: Callable[[], None], into: list[float]) -> None:
    started = time.perf_counter()
    fn()
    into.append((time.perf_counter() - started) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--database-url", required=True, help="the Lethe server's PostgreSQL")
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--window", type=int, default=10, help="messages kept in the thread's state")
    args = parser.parse_args()

    with Connection.connect(args.database_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    conn = Connection.connect(args.database_url, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                              options=f"-c search_path={SCHEMA}")
    postgres = PostgresSaver(conn)  # type: ignore[arg-type]
    postgres.setup()
    lethe = LetheSaver(args.url, args.key)

    threads = {"LetheSaver": Thread(lethe, args.window), "PostgresSaver": Thread(postgres, args.window)}
    timings: dict[str, dict[str, list[float]]] = {name: {"put": [], "get_tuple": []} for name in threads}
    for i in range(args.warmup + args.iterations):
        for name, thread in threads.items():  # interleaved: both see the same machine at the same moment
            put_ms: list[float] = []
            get_ms: list[float] = []
            _timed(thread.put, put_ms)
            _timed(thread.get, get_ms)
            if i >= args.warmup:
                timings[name]["put"] += put_ms
                timings[name]["get_tuple"] += get_ms

    print(f"{args.iterations} iterations after {args.warmup} warm-up, a {args.window}-message window")
    print(f"{'saver':<15}{'op':<11}{'median ms':>10}{'p99 ms':>10}")
    for name, ops in timings.items():
        for op, values in ops.items():
            print(f"{name:<15}{op:<11}{statistics.median(values):>10.3f}{_percentile(values, 0.99):>10.3f}")
    for op in ("put", "get_tuple"):
        lethe_ms, pg_ms = timings["LetheSaver"][op], timings["PostgresSaver"][op]
        print(f"ratio {op:<10} median {statistics.median(lethe_ms) / statistics.median(pg_ms):.2f}x  "
              f"p99 {_percentile(lethe_ms, 0.99) / _percentile(pg_ms, 0.99):.2f}x")
    lethe.delete_thread(threads["LetheSaver"].config["configurable"]["thread_id"])
    postgres.delete_thread(threads["PostgresSaver"].config["configurable"]["thread_id"])
    lethe.close()
    conn.close()


if __name__ == "__main__":
    main()
