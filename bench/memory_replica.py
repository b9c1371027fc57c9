"""`python -m bench.memory_bench --replica`: the memory load on the primary alone, then with one streaming replica.

One PostgreSQL primary and one streaming replica of it on loopback (bench/replication.py, fsync on, as the embedded
server runs); the same agents, mix and duration twice in one run, side by side: Lethe with the primary alone, then
Lethe with the replica as its read replica (fresh namespaces each time). The agents send their newest consistency
token with every read, as the Python client does, so the replica serves a read only once it has replayed the agent's
own writes and forgets. Printed: each run's table and history check, then throughput and p99 of both, the share of
reads the replica served (the server's `lethe_reads_total`), why the others went to the primary, and the CPU of every
process. On one machine the replica competes with the primary and with Lethe for the same cores: what it adds there
is a second copy of the data to read, not a second machine.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import psutil

from bench.memory_bench import API_KEY, NAMESPACES, Stats, cpu_by_pid, cpu_used, pct, report, run
from bench.replication import ReplicaPair, Server, served_reads
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


def _phase(pair: ReplicaPair, label: str, replica: bool, clients: int, processes: int, duration: float,
           n_keys: int, workers: int, prefix: str) -> Phase:
    env = {"LETHE_BOOTSTRAP_API_KEY": API_KEY, "LETHE_HTTP_WORKERS": str(workers),
           "LETHE_DATABASE_URL": pair.primary.url}
    if replica:
        env["LETHE_DATABASE_REPLICA_URLS"] = pair.replica.url
    with serving(**env) as lethe:
        roots = {"lethe serve": psutil.Process(lethe.proc.pid), "primary": _postmaster(pair.primary),
                 "replica": _postmaster(pair.replica)}
        before = {name: cpu_by_pid(root) for name, root in roots.items()}
        routed_before = served_reads(lethe.url)
        stats, generator_cpu = run(lethe.url, clients, processes, duration, n_keys, [prefix + n for n in NAMESPACES])
        cpu = Counter({name: cpu_used(root, before[name]) for name, root in roots.items()})
        cpu["load generator"] = generator_cpu
        routed = served_reads(lethe.url)
        routed.subtract(routed_before)
        errors = [line for line in lethe.log.read_text().splitlines() if '"level": "error"' in line]
    pair.wait_caught_up()
    return Phase(label, stats, cpu, +routed, errors)


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


def compare(clients: int, processes: int, duration: float, n_keys: int, workers: int, rounds: int = 1) -> int:
    """`rounds` > 1 alternates the two setups (alone, replica, alone, ...) and adds up each one's runs, so a machine
    whose load drifts during the run weighs on both alike; figures are then over `rounds` x `duration` seconds."""
    pair = ReplicaPair.create()
    runs: dict[bool, list[Phase]] = {False: [], True: []}
    try:
        for i in range(rounds):
            for replica, label in ((False, "primary alone"), (True, "primary + 1 replica")):
                prefix = f"{'b' if replica else 'a'}{i}-"
                runs[replica].append(
                    _phase(pair, label, replica, clients, processes, duration, n_keys, workers, prefix)
                )
    finally:
        pair.destroy()
    phases = [_merged(runs[False]), _merged(runs[True])]
    duration *= rounds
    code = 0
    for phase in phases:
        code |= report(phase.stats, duration, clients, title=f" ({phase.label})", per_reader=True)
        if phase.errors:
            print(f"server logged {len(phase.errors)} errors, first: {phase.errors[0][:500]}")
            code = 1
    alone, replicated = phases
    totals = [sum(len(v) for v in p.stats.latency.values()) for p in phases]
    routed = replicated.routed
    by_replica = sum(n for (by, _), n in routed.items() if by == "replica")
    fallbacks = ", ".join(f"{reason} {n}" for (by, reason), n in sorted(routed.items()) if by == "primary") or "none"
    print(f"\nread replicas, one run: {clients} clients, {duration:.0f} s each, {workers} HTTP worker(s), "
          f"{os.cpu_count()} cores")
    print(f"  primary alone:       {_line(alone, duration)}")
    print(f"  primary + 1 replica: {_line(replicated, duration)}; throughput x{totals[1] / max(1, totals[0]):.2f}")
    print(f"  reads the replica served: {by_replica} of {sum(routed.values())} "
          f"({100 * by_replica / max(1, sum(routed.values())):.1f} %; with a token "
          f"{routed[('replica', 'token')]}, without {routed[('replica', 'untokened')]}); "
          f"read the primary instead: {fallbacks}")
    for phase in phases:
        print(f"  CPU ({phase.label}): " + ", ".join(f"{k} {v / duration:.2f}" for k, v in phase.cpu.items()))
    return code
