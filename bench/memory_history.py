"""The tombstone invariant checked on a recorded history of memory operations (tests and bench.memory_bench).

Invariant (../shared/seeds/002_*.txt): once forget(k) has returned, no write based on a version older than the
tombstone is ever readable, until a write based on the tombstone version re-establishes the key. Every operation is
recorded with its start and end on the system-wide monotonic clock (comparable across processes), so "began after
the forget had returned" is a fact of the recording, not a guess.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
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


@dataclass
class Recorder:
    ops: list[Op] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)


def check_history(ops: list[Op]) -> dict[str, int]:
    """The invariant over the recorded operations; returns the counts (every violation count must be 0).

    Against each operation only the newest tombstone among the forgets that had returned before it began matters
    (every condition below is strongest for the highest tombstone version), found by bisection per key, so a bench's
    tens of thousands of operations check in well under a second."""
    writes = {o.tag: o for o in ops if o.kind == "write" and o.status in (200, 201)}
    ends: dict[str, list[float]] = defaultdict(list)
    newest: dict[str, list[int]] = defaultdict(list)  # running max of tombstone versions, by forget end time
    for f in sorted((o for o in ops if o.kind == "forget" and o.status == 200), key=lambda o: o.end):
        assert f.version is not None
        ends[f.key].append(f.end)
        newest[f.key].append(max(f.version, newest[f.key][-1] if newest[f.key] else 0))
    resurrections = stale_landed = stale_reads = checked = 0
    for o in ops:
        returned = bisect.bisect_left(ends[o.key], o.start)  # forgets of this key that ended before o began
        if returned == 0:
            continue
        tombstone = newest[o.key][returned - 1]
        checked += 1
        if o.kind == "read":
            seen = o.version or 0
            if o.status == 200:
                w = writes.get(o.tag)  # None: the seed value, written before any forget
                if w is None or w.base is None or w.base < tombstone:
                    resurrections += 1  # a read shows a value written from before the tombstone
            if seen < tombstone or (o.status == 200 and seen == tombstone):
                stale_reads += 1
        if o.kind == "write" and o.status in (200, 201) and (o.base or 0) < tombstone:
            stale_landed += 1
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
        "forgets": sum(len(v) for v in ends.values()),
        "ops_checked_against_a_forget": checked,
    }


VIOLATIONS = ("resurrections", "stale_writes_landed", "stale_reads", "cas_violations", "duplicate_versions")
