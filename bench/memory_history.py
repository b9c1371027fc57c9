"""The tombstone invariant checked on a recorded history of memory operations (tests and bench.memory_bench).

Invariant (../shared/seeds/002_*.txt): once forget(k) has returned, no write based on a version older than the
tombstone is ever readable, until a write based on the tombstone version re-establishes the key. Every operation is
recorded with its start and end on the system-wide monotonic clock (comparable across processes), so "began after
the forget had returned" is a fact of the recording, not a guess.

With read replicas (`per_reader=True`) a read is held to the forgets its own reader saw returning (its client then
holds their Lethe-Consistency token and sends it): reads of other clients may lag behind a forget they never heard of,
which is eventual consistency, counted apart as `reads_behind_others_forgets`, not as a violation.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Op:
    kind: str  # read | write | forget
    key: str  # namespace and key, as the caller names them
    start: float
    end: float
    status: int
    base: int | None = None  # writes: the version the write was based on
    version: int | None = None  # the version read, written, or the tombstone
    tag: str | None = None  # writes: the unique value written; reads: the value seen
    forgotten: bool = False  # reads: the key reads forgotten; forgets: it already was
    reader: str | None = None  # the client that issued it (per-reader checks)


@dataclass
class Recorder:
    ops: list[Op] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)


def _tombstones(ops: list[Op], group: Callable[[Op], object]) -> Callable[[Op], int]:
    """For an operation, the newest tombstone among the forgets of its group that had returned before it began
    (0: none). Every condition below is strongest for the highest tombstone version, so only that one matters; it is
    found by bisection per group, so a bench's tens of thousands of operations check in well under a second."""
    ends: dict[object, list[float]] = defaultdict(list)
    newest: dict[object, list[int]] = defaultdict(list)  # running max of tombstone versions, by forget end time
    for f in sorted((o for o in ops if o.kind == "forget" and o.status == 200), key=lambda o: o.end):
        assert f.version is not None
        ends[group(f)].append(f.end)
        newest[group(f)].append(max(f.version, newest[group(f)][-1] if newest[group(f)] else 0))

    def tombstone(o: Op) -> int:
        returned = bisect.bisect_left(ends[group(o)], o.start)  # forgets of the group that ended before o began
        return newest[group(o)][returned - 1] if returned else 0

    return tombstone


def _stale(o: Op, tombstone: int, writes: dict[str | None, Op]) -> tuple[bool, bool]:
    """(resurrection, stale read) for a read against the newest tombstone it must not be older than (0: none)."""
    if tombstone == 0:
        return False, False
    resurrected = False
    if o.status == 200:
        w = writes.get(o.tag)  # None: the seed value, written before any forget
        resurrected = w is None or w.base is None or w.base < tombstone  # a value written from before the tombstone
    seen = o.version or 0
    return resurrected, seen < tombstone or (o.status == 200 and seen == tombstone)


def check_history(ops: list[Op], *, per_reader: bool = False) -> dict[str, int]:
    """The invariant over the recorded operations; returns the counts (every violation count must be 0)."""
    writes = {o.tag: o for o in ops if o.kind == "write" and o.status in (200, 201)}
    by_key = _tombstones(ops, lambda o: o.key)
    by_reader = _tombstones(ops, lambda o: (o.reader, o.key)) if per_reader else by_key
    resurrections = stale_landed = stale_reads = checked = behind_others = 0
    for o in ops:
        newest = by_key(o)
        if newest == 0:
            continue
        checked += 1
        if o.kind == "read":
            resurrected, stale = _stale(o, by_reader(o), writes)
            resurrections += resurrected
            stale_reads += stale
            behind_others += any(_stale(o, newest, writes)) and not (resurrected or stale)
        if o.kind == "write" and o.status in (200, 201) and (o.base or 0) < newest:
            stale_landed += 1  # writes go to the primary: held to every forget that had returned, whoever asked
    # every landed write got exactly base + 1, and no two writes of a key got the same version
    cas_violations = sum(1 for w in writes.values() if w.version != (w.base or 0) + 1)
    versions = [(o.key, o.version) for o in writes.values()]
    return {
        "resurrections": resurrections,
        "stale_writes_landed": stale_landed,
        "stale_reads": stale_reads,
        "cas_violations": cas_violations,
        "duplicate_versions": len(versions) - len(set(versions)),
        "writes_landed": len(writes),
        "writes_rejected": sum(1 for o in ops if o.kind == "write" and o.status == 412),
        "forgets": sum(1 for o in ops if o.kind == "forget" and o.status == 200),
        "ops_checked_against_a_forget": checked,
        "reads_behind_others_forgets": behind_others,
    }


VIOLATIONS = ("resurrections", "stale_writes_landed", "stale_reads", "cas_violations", "duplicate_versions")
