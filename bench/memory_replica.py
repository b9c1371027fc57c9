"""`python -m bench.memory_bench --replica`: the memory load on the primary alone, then with one streaming replica.

One PostgreSQL primary and one streaming replica of it on loopback (bench/replication.py, fsync on, as the embedded
server runs); the same agents, mix and duration twice in one run, side by side: Lethe with the primary alone, then
Lethe with the replica as its read replica (fresh namespaces each time). The agents send their newest consistency
token with every read, as the Python client does, so the replica serves a read only once it has replayed the agent's
own writes and forgets. Printed: each run's table and history check, then throughput and p99 of both, the share of
reads the replica served (the server's `lethe_reads_total`), why the others went to the primary, and the CPU of every
process. On one machine the replica competes with the primary and with Lethe for the same cores: what it adds there
is a second copy of the data to read, not a second machine. `--strict` adds a third setup, the replica synchronous
(`synchronous_standby_names = '*'`) and Lethe's forgets committed with remote_apply (`LETHE_FORGET_REMOTE_APPLY`):
what strict forgets cost. `--rounds N` alternates the setups N times.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import psutil

from bench.memory_bench import API_KEY, NAMESPACES, Stats, cpu_by_pid, cpu_used, pct, report, run
from bench.replication import ReplicaPair, Server, query, served_reads
from bench.serve import serving


@dataclass
class Phase:
    label: str
    stats: Stats
    cpu: Counter[str]  # CPU seconds by process
    routed: Counter[tuple[str, str]]
    errors: list[str]


def _postmaster(server: Server) -> psutil.Process:
    pid = server.pid()
    assert pid is not None, f"{server.pgdata} is not running"
    return psutil.Process(pid)


@dataclass(frozen=True)
class Setup:
    label: str
    replica: bool  # the replica serves reads
    strict: bool = False  # the replica is synchronous and forgets commit with remote_apply


SETUPS = (Setup("primary alone", False), Setup("primary + 1 replica", True))
STRICT = Setup("primary + 1 synchronous replica, strict forgets", True, strict=True)


def _phase(pair: ReplicaPair, setup: Setup, clients: int, processes: int, duration: float, n_keys: int,
           workers: int, prefix: str) -> Phase:
    env = {"LETHE_BOOTSTRAP_API_KEY": API_KEY, "LETHE_HTTP_WORKERS": str(workers),
           "LETHE_DATABASE_URL": pair.primary.url}
    if setup.replica:
        env["LETHE_DATABASE_REPLICA_URLS"] = pair.replica.url
    if setup.strict:
        env["LETHE_FORGET_REMOTE_APPLY"] = "true"
        _synchronous(pair, "'*'")
    try:
        with serving(**env) as lethe:
            roots = {"lethe serve": psutil.Process(lethe.proc.pid), "primary": _postmaster(pair.primary),
                     "replica": _postmaster(pair.replica)}
            before = {name: cpu_by_pid(root) for name, root in roots.items()}
            routed_before = served_reads(lethe.url)
            namespaces = [prefix + n for n in NAMESPACES]
            stats, generator_cpu = run(lethe.url, clients, processes, duration, n_keys, namespaces)
            cpu = Counter({name: cpu_used(root, before[name]) for name, root in roots.items()})
            cpu["load generator"] = generator_cpu
            routed = served_reads(lethe.url)
            routed.subtract(routed_before)
            errors = [line for line in lethe.log.read_text().splitlines() if '"level": "error"' in line]
    finally:
        if setup.strict:
            _synchronous(pair, None)
    pair.wait_caught_up()
    return Phase(setup.label, stats, cpu, +routed, errors)


def _synchronous(pair: ReplicaPair, names: str | None) -> None:
    """`synchronous_standby_names` on the primary: '*' makes the replica synchronous, None resets it."""
    admin = pair.primary.url
    query(admin, "ALTER SYSTEM RESET synchronous_standby_names" if names is None
          else f"ALTER SYSTEM SET synchronous_standby_names = {names}")
    query(admin, "SELECT pg_reload_conf()")


def _line(phase: Phase, duration: float) -> str:
    every = [x for values in phase.stats.latency.values() for x in values]
    reads = phase.stats.latency["read"]
    return (f"{len(every) / duration:,.0f} ops/s; p50 / p99 all {pct(every, 50):.1f} / {pct(every, 99):.1f} ms, "
            f"read {pct(reads, 50):.1f} / {pct(reads, 99):.1f} ms")


def _merged(runs: list[Phase]) -> Phase:
    first = runs[0]
    merged = Phase(first.label, Stats(), Counter(), Counter(), [])
    for run_ in runs:
        merged.stats.merge(run_.stats)
        merged.cpu.update(run_.cpu)
        merged.routed.update(run_.routed)
        merged.errors.extend(run_.errors)
    return merged


def compare(
    clients: int, processes: int, duration: float, n_keys: int, workers: int, rounds: int = 1, strict: bool = False,
    durable: bool = True,
) -> int:
    """`rounds` > 1 alternates the setups (alone, replica, alone, ...) and adds up each one's runs, so a machine
    whose load drifts during the run weighs on all alike; figures are then over `rounds` x `duration` seconds.
    `strict` adds a third setup: the replica synchronous, forgets with remote_apply (what strict forgets cost).
    `durable=False` turns fsync off on both servers: on a disk shared with other load every commit (and every WAL
    flush on the replica, which replays only what it flushed) waits for it, which hides everything else."""
    setups = [*SETUPS, STRICT] if strict else list(SETUPS)
    load = os.getloadavg()  # the machine is shared: what else was running, for the reader of the figures
    pair = ReplicaPair.create(durable=durable)
    runs: dict[Setup, list[Phase]] = {setup: [] for setup in setups}
    try:
        for i in range(rounds):
            for n, setup in enumerate(setups):
                prefix = f"s{n}r{i}-"
                runs[setup].append(_phase(pair, setup, clients, processes, duration, n_keys, workers, prefix))
    finally:
        pair.destroy()
    phases = [_merged(runs[setup]) for setup in setups]
    duration *= rounds
    code = 0
    for phase in phases:
        code |= report(phase.stats, duration, clients, title=f" ({phase.label})", per_reader=True)
        if phase.errors:
            print(f"server logged {len(phase.errors)} errors, first: {phase.errors[0][:500]}")
            code = 1
    totals = [sum(len(v) for v in p.stats.latency.values()) for p in phases]
    routed = phases[1].routed
    by_replica = sum(n for (by, _), n in routed.items() if by == "replica")
    fallbacks = ", ".join(f"{reason} {n}" for (by, reason), n in sorted(routed.items()) if by == "primary") or "none"
    print(f"\nread replicas, one run: {clients} clients, {duration:.0f} s each, {workers} HTTP worker(s), "
          f"{os.cpu_count()} cores, fsync {'on' if durable else 'off'}, load average before "
          + " ".join(f"{x:.1f}" for x in load))
    for phase, total in zip(phases, totals, strict=True):
        print(f"  {phase.label}: {_line(phase, duration)}; throughput x{total / max(1, totals[0]):.2f}")
    print(f"  reads the replica served ({phases[1].label}): {by_replica} of {sum(routed.values())} "
          f"({100 * by_replica / max(1, sum(routed.values())):.1f} %; with a token "
          f"{routed[('replica', 'token')]}, without {routed[('replica', 'untokened')]}); "
          f"read the primary instead: {fallbacks}")
    for phase in phases:
        forgets = phase.stats.latency["forget"]
        print(f"  forget p50 / p99 ({phase.label}): {pct(forgets, 50):.1f} / {pct(forgets, 99):.1f} ms")
    for phase in phases:
        print(f"  CPU ({phase.label}): " + ", ".join(f"{k} {v / duration:.2f}" for k, v in phase.cpu.items()))
    return code
