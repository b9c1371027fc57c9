"""Memory API load: 32 concurrent clients mixing reads, conditional writes and forgets against a real `lethe serve`.

    python -m bench.memory_bench [--workers 2] [--clients 32] [--processes 1] [--duration 30] [--keys 256]
                                 [--no-pgbench] [--replica] [--baseline-commit be86ddb [--rounds 2]]

Starts `lethe serve` itself (bench.serve: embedded PostgreSQL in a temp dir, the converted model from .lethe/models),
drives it over HTTP for a fixed time, then prints throughput and p50/p99 latency per operation and how many writes
were rejected as stale (412), those rejected by a tombstone among them. Every operation is recorded with its start
and end, and the tombstone invariant is checked on that history (bench.memory_history: resurrections, stale writes
landed, stale reads). Any 5xx, transport error or violation fails the run.

The load generator shares the machine with what it measures, so it must be cheap: each client is one keep-alive
connection of bench.lean_http (pre-framed requests, only status and Content-Length parsed, uvloop) rather than httpx,
which cost ~0.9 ms of CPU per request. Clients can be spread over `--processes` processes; the CPU the generator used
is printed beside the server's and PostgreSQL's. Then, in the
same run and on the same database, pgbench drives PostgreSQL alone with the same mix of statements
(bench/sql/memory_mix.pgbench) from as many clients, and the ratio of Lethe's throughput to it is printed.

Clients behave like agents: each remembers the version it last saw of a key and writes based on it, so with many
clients on a few hundred keys a good share of writes are stale, and some are based on a version from before a
forget: exactly the writes the tombstones must reject. Each also keeps the newest Lethe-Consistency token its
answers carried and sends it with its reads, as the Python client does.

`--replica`: a PostgreSQL primary and a streaming replica of it on loopback (bench/replication.py), and the same load
twice in one run, side by side: Lethe on the primary alone, then Lethe on the primary with the replica as its read
replica. Printed: throughput and p50/p99 of both, the share of reads the replica served, and the history check of
each, the replica's held per client (no client reads what it saw forgotten; reads that missed another client's
forget are eventual consistency, counted apart).

`--baseline-commit be86ddb`: memory values sealed at rest (this tree) against clear (that commit's code, from a
`git worktree` of it), rounds alternating in one run, each with its history check, and the ratio
(bench/memory_sealing.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import multiprocessing
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import uvloop
from lethe_client._consistency import newer

from bench.lean_http import Connection, TransportError
from bench.memory_history import VIOLATIONS, Op, check_history
from bench.serve import serving

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "bench-key-" + "0" * 24
NAMESPACES = ["user-1", "user-2", "user-3", "user-4"]
MIX = (("read", 0.6), ("write", 0.3), ("forget", 0.1))


@dataclass
class Stats:
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    stale_rejected: int = 0
    rejected_by_tombstone: int = 0
    transport_errors: list[str] = field(default_factory=list)
    history: list[Op] = field(default_factory=list)

    def record(self, op: Op) -> None:
        self.latency[op.kind].append(op.end - op.start)
        self.statuses[op.kind][op.status] += 1
        self.history.append(op)

    def merge(self, other: Stats) -> None:
        for op, values in other.latency.items():
            self.latency[op].extend(values)
        for op, counter in other.statuses.items():
            self.statuses[op].update(counter)
        self.stale_rejected += other.stale_rejected
        self.rejected_by_tombstone += other.rejected_by_tombstone
        self.transport_errors.extend(other.transport_errors)
        self.history.extend(other.history)


async def seed(base: str, keys: list[str], namespaces: list[str]) -> None:
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        for ns in namespaces:
            writes = [{"key": k, "value": {"fact": k, "v": 0}, "base_version": 0, "source": "user"} for k in keys]
            r = await c.post(f"/v1/memory/{ns}:batch", json={"atomic": True, "writes": writes})
            r.raise_for_status()


@dataclass
class Agent:
    """What one agent remembers: the version it last saw of each key, and the newest consistency token."""

    name: str
    seen: dict[tuple[str, str], int] = field(default_factory=dict)
    token: str | None = None

    def observe(self, token: str | None) -> None:
        if token:
            self.token = newer(self.token, token)


async def agent(
    conn: Connection, keys: list[str], namespaces: list[str], until: float, seed_: int, stats: Stats
) -> None:
    rng = random.Random(seed_)
    me = Agent(f"agent-{seed_}")
    ops = [op for op, _ in MIX]
    weights = [w for _, w in MIX]
    while time.time() < until:
        ns, key = rng.choice(namespaces), rng.choice(keys)
        kind = rng.choices(ops, weights)[0]
        t0 = time.monotonic()
        try:
            op = await one(conn, kind, ns, key, me, stats)
        except TransportError as exc:  # counted and reported: the run then fails
            stats.transport_errors.append(f"{kind} {ns}/{key}: {exc}")
            return  # this connection is gone; the agent stops rather than hide the error behind a reconnect
        op.start, op.end, op.reader = t0, time.monotonic(), me.name
        stats.record(op)


async def one(conn: Connection, kind: str, ns: str, key: str, me: Agent, stats: Stats) -> Op:
    """One request of an agent, as a history entry (its times are set by the caller)."""
    path = f"/v1/memory/{ns}/{key}"
    name = f"{ns}/{key}"
    seen = me.seen
    if kind == "read":
        r = await conn.request("GET", path, headers={"Lethe-Consistency": me.token} if me.token else None)
        body = r.json()
        seen[(ns, key)] = body.get("version", 0)
        tag = body["value"].get("n") if r.status == 200 else None
        return Op("read", name, 0, 0, r.status, version=body.get("version"), tag=tag,
                  forgotten=bool(body.get("forgotten")))
    if kind == "write":
        base = seen.get((ns, key), 1)
        cond = {"If-None-Match": "*"} if base == 0 else {"If-Match": f'"{base}"'}
        tag = uuid.uuid4().hex
        r = await conn.request("PUT", path, {"value": {"fact": key, "n": tag}, "source": "agent"}, cond)
        me.observe(r.consistency)
        body = r.json()
        if r.status == 412:
            stats.stale_rejected += 1
            stats.rejected_by_tombstone += bool(body.get("forgotten"))
            seen[(ns, key)] = body["current_version"]  # an agent re-reads before trying again
        elif r.status in (200, 201):
            seen[(ns, key)] = body["version"]
        version = body.get("version") if r.status in (200, 201) else body.get("current_version")
        return Op("write", name, 0, 0, r.status, base=base, version=version, tag=tag)
    r = await conn.request("DELETE", path)
    me.observe(r.consistency)
    body = r.json()
    # deliberately keep the pre-forget version: this agent's next write is the summarizer's stale flush
    return Op("forget", name, 0, 0, r.status, version=body.get("version"),
              forgotten=bool(body.get("already_forgotten")))


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) >= 2 else values[0] * 1000


async def _agents(base: str, ids: list[int], until: float, n_keys: int, namespaces: list[str]) -> Stats:
    keys = [f"fact-{i:04d}" for i in range(n_keys)]
    url = httpx.URL(base)
    conns = [Connection(url.host, url.port or 80, {"Authorization": f"Bearer {API_KEY}"}) for _ in ids]
    await asyncio.gather(*(c.open() for c in conns))
    stats = Stats()
    try:
        await asyncio.gather(*(agent(c, keys, namespaces, until, i, stats) for c, i in zip(conns, ids, strict=True)))
    finally:
        for c in conns:
            c.close()
    return stats


def _agents_process(base: str, ids: list[int], until: float, n_keys: int, namespaces: list[str]) -> Stats:
    return uvloop.run(_agents(base, ids, until, n_keys, namespaces))


def run(
    base: str, clients: int, processes: int, duration: float, n_keys: int, namespaces: list[str] = NAMESPACES
) -> tuple[Stats, float]:
    """Seed, then `clients` agents spread over `processes` processes; returns the stats and the CPU seconds the load
    generator used (its processes, this one's share of the run included)."""

    asyncio.run(seed(base, [f"fact-{i:04d}" for i in range(n_keys)], namespaces))
    groups = [ids for p in range(processes) if (ids := list(range(p, clients, processes)))]
    mine = resource.getrusage(resource.RUSAGE_SELF)
    # Children this process waited for before (an earlier run's generators, a server it stopped) are not this run's.
    earlier = resource.getrusage(resource.RUSAGE_CHILDREN)
    until = time.time() + duration  # wall clock: shared by the processes
    stats = Stats()
    with multiprocessing.get_context("spawn").Pool(len(groups)) as pool:
        for part in pool.starmap(_agents_process, [(base, ids, until, n_keys, namespaces) for ids in groups]):
            stats.merge(part)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (children.ru_utime - earlier.ru_utime) + (children.ru_stime - earlier.ru_stime)
    cpu += (after.ru_utime - mine.ru_utime) + (after.ru_stime - mine.ru_stime)
    return stats, cpu


def cpu_by_pid(root: psutil.Process) -> dict[int, float]:
    """CPU seconds of `root` and its descendants now, by pid (a process that exits in between is not counted)."""
    seconds: dict[int, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            seconds[proc.pid] = times.user + times.system
    return seconds


def cpu_used(root: psutil.Process, before: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in cpu_by_pid(root).items())


def postmaster(data: Path) -> psutil.Process:
    """The embedded server (pg_ctl started it: not a child of lethe serve); its backends are its children."""
    return psutil.Process(int((data / "pg" / "postmaster.pid").read_text().split()[0]))


def pgbench(data: Path, clients: int, duration: float, n_keys: int) -> float:
    """Transactions per second of PostgreSQL alone on the same mix and database (bench/sql/memory_mix.pgbench)."""
    import pgserver  # type: ignore[import-untyped]

    from app.db.embedded import start_embedded_postgres

    url = start_embedded_postgres(data)
    binary = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pgbench"
    tenant = _tenant_of(url)
    keyhash = hashlib.sha256(API_KEY.encode()).hexdigest()
    out = subprocess.run(
        [str(binary), "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, os.cpu_count() or 1)),
         "-T", str(int(duration)), "-f", str(ROOT / "bench" / "sql" / "memory_mix.pgbench"),
         "-D", f"keyhash='{keyhash}'", "-D", f"tenant='{tenant}'", "-D", f"keys={n_keys}", url],
        capture_output=True, text=True, check=True,
    ).stdout
    found = re.search(r"tps = ([0-9.]+)", out)
    if found is None:
        raise SystemExit("pgbench printed no tps:\n" + out)
    return float(found.group(1))


def _tenant_of(url: str) -> str:
    import asyncpg

    async def query() -> str:
        conn = await asyncpg.connect(url)
        try:
            key = hashlib.sha256(API_KEY.encode()).hexdigest()
            return str(await conn.fetchval("SELECT tenant_id FROM api_keys WHERE key_sha256 = $1", key))
        finally:
            await conn.close()

    return asyncio.run(query())


def report(stats: Stats, duration: float, clients: int, *, title: str = "", per_reader: bool = False) -> int:
    """Print the run's figures and its history check; 1 when anything failed (5xx, transport error, violation).
    `per_reader`: reads are held to their own client's forgets (read replicas: bench/memory_history.py)."""
    print(f"\nmemory bench{title}: {clients} clients, {duration:.0f} s, namespaces {len(NAMESPACES)}")
    print(f"{'op':<8}{'count':>9}{'ops/s':>10}{'p50 ms':>10}{'p99 ms':>10}  statuses")
    total = 0
    for op, _ in MIX:
        lat = stats.latency[op]
        if not lat:
            continue
        total += len(lat)
        statuses = " ".join(f"{code}:{n}" for code, n in sorted(stats.statuses[op].items()))
        print(f"{op:<8}{len(lat):>9}{len(lat) / duration:>10.0f}{pct(lat, 50):>10.2f}{pct(lat, 99):>10.2f}  {statuses}")
    every = [x for op, _ in MIX for x in stats.latency[op]]
    if every:
        print(f"{'all':<8}{total:>9}{total / duration:>10.0f}{pct(every, 50):>10.2f}{pct(every, 99):>10.2f}")
    writes = sum(stats.statuses["write"].values())
    print(
        f"stale writes rejected (412): {stats.stale_rejected} of {writes} writes, "
        f"{stats.rejected_by_tombstone} of them by a tombstone"
    )
    errors = sum(n for counter in stats.statuses.values() for code, n in counter.items() if code >= 500)
    if errors:
        print(f"FAILED: {errors} server errors")
    if stats.transport_errors:
        print(f"FAILED: {len(stats.transport_errors)} transport errors, first: {stats.transport_errors[:3]}")
    counts = check_history(stats.history, per_reader=per_reader)
    violations = {name: counts[name] for name in VIOLATIONS}
    print(f"history check over {len(stats.history)} operations ({counts['ops_checked_against_a_forget']} began after "
          f"a forget of their key had returned): " + ", ".join(f"{k} {v}" for k, v in violations.items()))
    if per_reader:
        print(f"  each read held to its own client's forgets; reads that missed another client's forget (eventually "
              f"consistent, allowed): {counts['reads_behind_others_forgets']}")
    if any(violations.values()):
        print("FAILED: the tombstone invariant was broken")
    return 1 if errors or stats.transport_errors or any(violations.values()) else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--processes", type=int, default=1, help="load-generator processes the clients share")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--keys", type=int, default=256, help="keys per namespace")
    parser.add_argument("--no-pgbench", action="store_true", help="skip PostgreSQL's own figure")
    parser.add_argument("--workers", type=int, default=1, help="LETHE_HTTP_WORKERS of the server")
    parser.add_argument("--replica", action="store_true",
                        help="primary alone against primary + one streaming replica, side by side (no pgbench)")
    parser.add_argument("--baseline-commit", metavar="COMMIT",
                        help="this tree (memory values sealed at rest) against COMMIT's, e.g. be86ddb (just before "
                        "sealing), alternating, side by side (bench/memory_sealing.py; no pgbench)")
    parser.add_argument("--sealed-commit", metavar="COMMIT",
                        help="--baseline-commit: the sealed side from a worktree of COMMIT, not this checkout")
    parser.add_argument("--rounds", type=int, default=None,
                        help="--replica / --baseline-commit: alternate the setups this many times (default 1 / 2)")
    parser.add_argument("--strict", action="store_true",
                        help="--replica: a third setup, the replica synchronous and forgets with remote_apply")
    parser.add_argument("--fsync-off", action="store_true",
                        help="--replica: fsync off on both servers (a busy shared disk otherwise dominates)")
    args = parser.parse_args()
    if args.replica:
        from bench.memory_replica import compare

        sys.exit(compare(args.clients, max(1, args.processes), args.duration, args.keys, args.workers,
                         args.rounds or 1, args.strict, durable=not args.fsync_off))
    if args.baseline_commit:
        from bench.memory_sealing import compare as compare_sealing

        sys.exit(compare_sealing(args.baseline_commit, args.clients, max(1, args.processes), args.duration, args.keys,
                                 args.workers, args.rounds or 2, args.sealed_commit))
    with serving(LETHE_BOOTSTRAP_API_KEY=API_KEY, LETHE_HTTP_WORKERS=str(args.workers)) as lethe:
        base, log, data = lethe.url, lethe.log, lethe.data_dir
        roots = [psutil.Process(lethe.proc.pid), postmaster(data)]
        before = [cpu_by_pid(root) for root in roots]
        stats, generator_cpu = run(base, args.clients, max(1, args.processes), args.duration, args.keys)
        server_cpu, postgres_cpu = (cpu_used(root, b) for root, b in zip(roots, before, strict=True))
        errors = [line for line in log.read_text().splitlines() if '"level": "error"' in line]
        tps = None if args.no_pgbench else pgbench(data, args.clients, args.duration, args.keys)
    code = report(stats, args.duration, args.clients)
    cores = os.cpu_count() or 1
    print(f"CPU over the run ({cores} cores): lethe serve ({args.workers} HTTP workers) "
          f"{server_cpu / args.duration:.2f} cores, PostgreSQL "
          f"{postgres_cpu / args.duration:.2f}, load generator ({args.processes} processes) "
          f"{generator_cpu / args.duration:.2f}")
    if tps is not None:
        total = sum(len(v) for v in stats.latency.values()) / args.duration
        print(f"pgbench, same mix, {args.clients} clients: {tps:.0f} transactions/s; Lethe reaches "
              f"{100 * total / tps:.1f} % of it")
    if errors:
        print(f"server logged {len(errors)} errors, first: {errors[0][:500]}")
    sys.exit(code or (1 if errors else 0))


if __name__ == "__main__":
    main()
