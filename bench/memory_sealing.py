"""`python -m bench.memory_bench --baseline-commit be86ddb`: the memory load with values sealed at rest and without.

Sealed is this checkout's code; clear is an older commit's, `be86ddb` being the tree just before sealing (9ce2a63).
There is no setting that turns sealing off, so the older code serves: a `git worktree` of that commit under the temp
directory (made once, reused by later runs), its `python -m app serve` started in it with it on PYTHONPATH
(bench/serve.py `tree=`), with this interpreter and virtual environment. `--sealed-commit` serves the sealed side
the same way, from a worktree of that commit instead of this checkout (whose working tree may hold anything).
Each tree has its own data directory and embedded PostgreSQL. The same agents, mix and duration run in rounds that
alternate, sealed, clear, sealed, clear (`--rounds`, default 2 pairs), each on fresh namespaces and a server started
for it, so a machine whose load drifts weighs on both alike; each tree's rounds are then added up. Printed: each
tree's table and history check, then throughput and p50/p99 of both and their ratio (the issue's goal: sealing costs
at most 10 %), each round's throughput (the spread between rounds of one tree is the noise to read the ratio
against), and CPU per operation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.memory_bench import API_KEY, MIX, NAMESPACES, Stats, cpu_by_pid, cpu_used, pct, postmaster, report, run
from bench.serve import ROOT, serving, stop_postgres

GOAL = 0.10  # issue 42: sealing may cost at most 10 % of throughput


@dataclass
class Tree:
    label: str
    path: Path
    commit: str
    data_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="lethe-sealing-")))
    stats: Stats = field(default_factory=Stats)
    cpu: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)  # operations per second of each round


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def worktree(commit: str) -> tuple[Path, str]:
    """A checkout of `commit` under the temp directory (added once, detached); its path and full hash."""
    sha = _git("rev-parse", "--verify", f"{commit}^{{commit}}")
    path = Path(tempfile.gettempdir()) / f"lethe-tree-{sha[:12]}"
    if not (path / "app" / "__main__.py").is_file():
        _git("worktree", "prune")  # a worktree whose directory was deleted is still registered until pruned
        _git("worktree", "add", "--detach", str(path), sha)
    if (found := _git("rev-parse", "HEAD", cwd=path)) != sha:
        raise SystemExit(f"{path} is at {found}, not {sha}: remove it (git worktree remove) and run again")
    return path, sha


def _round(tree: Tree, clients: int, processes: int, duration: float, n_keys: int, workers: int, prefix: str) -> None:
    env = {"LETHE_BOOTSTRAP_API_KEY": API_KEY, "LETHE_HTTP_WORKERS": str(workers)}
    with serving(tree.data_dir, tree=tree.path, **env) as lethe:
        roots = {"lethe serve": psutil.Process(lethe.proc.pid), "PostgreSQL": postmaster(tree.data_dir)}
        before = {name: cpu_by_pid(root) for name, root in roots.items()}
        stats, generator_cpu = run(lethe.url, clients, processes, duration, n_keys, [prefix + n for n in NAMESPACES])
        tree.cpu.update({name: cpu_used(root, before[name]) for name, root in roots.items()})
        tree.cpu["load generator"] += generator_cpu
        tree.errors += [line for line in lethe.log.read_text().splitlines() if '"level": "error"' in line]
    tree.stats.merge(stats)
    tree.rounds.append(sum(len(v) for v in stats.latency.values()) / duration)


def _line(tree: Tree, duration: float) -> str:
    every = [x for values in tree.stats.latency.values() for x in values]
    ops = " ".join(f"{op} {pct(tree.stats.latency[op], 50):.1f} / {pct(tree.stats.latency[op], 99):.1f}"
                   for op, _ in MIX if tree.stats.latency[op])
    return (f"{len(every) / duration:,.0f} ops/s; p50 / p99 ms: all {pct(every, 50):.1f} / {pct(every, 99):.1f}, "
            f"{ops}")


def compare(
    commit: str, clients: int, processes: int, duration: float, n_keys: int, workers: int, rounds: int = 2,
    sealed_commit: str | None = None,
) -> int:
    """Alternate `rounds` times this tree (sealed; or `sealed_commit`'s worktree) and `commit`'s (clear); figures
    over `rounds` x `duration` seconds."""
    load = os.getloadavg()  # the machine is shared: what else was running, for the reader of the figures
    old, sha = worktree(commit)
    if sealed_commit:
        new, new_sha = worktree(sealed_commit)
        sealed = Tree("sealed", new, new_sha[:12])
    else:
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        sealed = Tree("sealed", ROOT, _git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" * bool(dirty)))
    trees = [sealed, Tree("clear", old, sha[:12])]
    try:
        for i in range(rounds):
            for tree in trees:
                _round(tree, clients, processes, duration, n_keys, workers, f"{tree.label}{i}-")
    finally:
        for tree in trees:
            stop_postgres(tree.data_dir / "pg")
            shutil.rmtree(tree.data_dir, ignore_errors=True)
    total_s = duration * rounds
    code = 0
    for tree in trees:
        code |= report(tree.stats, total_s, clients, title=f" ({tree.label}: {tree.commit}, {tree.path})")
        if tree.errors:
            first = tree.errors[0]  # its start says where, its end (the traceback's last line) what
            print(f"server logged {len(tree.errors)} errors, first: {first[:300]} ... {first[-700:]}")
            code = 1
    print(f"\nsealed at rest against clear, one run: {clients} clients, {rounds} x {duration:.0f} s each, alternating "
          f"sealed, clear; {workers} HTTP worker(s), {os.cpu_count()} cores, load average before "
          + " ".join(f"{x:.1f}" for x in load))
    for tree in trees:
        print(f"  {tree.label:<6} ({tree.commit}): {_line(tree, total_s)}")
        print("         each round: " + ", ".join(f"{x:,.0f}" for x in tree.rounds) + " ops/s")
    ops = {t.label: sum(len(v) for v in t.stats.latency.values()) for t in trees}
    p99 = {t.label: pct([x for v in t.stats.latency.values() for x in v], 99) for t in trees}
    ratio = ops["sealed"] / max(1, ops["clear"])
    print(f"  sealed / clear: throughput x{ratio:.3f} (cost {100 * (1 - ratio):.1f} %, goal <= {100 * GOAL:.0f} %: "
          f"{'met' if 1 - ratio <= GOAL else 'NOT met'}), p99 x{p99['sealed'] / p99['clear']:.3f}")
    for tree in trees:
        per_op = ", ".join(f"{k} {1e6 * v / max(1, ops[tree.label]):.0f}" for k, v in tree.cpu.items())
        print(f"  CPU µs per operation ({tree.label}): {per_op}")
    return code
