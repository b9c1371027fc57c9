"""Consistency tokens: a point in the primary's history that a later read must not be older than (read-your-forgets).

A token is the primary's WAL position after a write committed, tagged with the cluster's system identifier and the
timeline it was written on: `v1` and 40 lowercase hex digits, the system identifier (16), the timeline (8) and the
LSN (16), so it travels in any header and every string of that shape is a token. A streaming replica whose replay
has passed the position holds everything committed before it, the forget included; one that has not, or one on
another cluster or timeline, must not serve a read that carries it (app/db/replicas.py).

`ReadFrom` is what a read asks of the router: the primary, any replica (eventually consistent), or a replica that
has replayed past a token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADER = "Lethe-Consistency"
TOKEN_PATTERN = r"^v1[0-9a-f]{40}$"
_TOKEN = re.compile(TOKEN_PATTERN)

# WAL page headers (64-bit builds): every page starts with one, the first page of a segment with the long one.
SHORT_PAGE_HEADER, LONG_PAGE_HEADER = 24, 40


@dataclass(frozen=True, order=True)
class ConsistencyToken:
    system_id: int  # pg_control_system().system_identifier: the same on a primary and its physical replicas
    timeline: int  # a promotion starts a new one; positions on different timelines are not comparable
    lsn: int  # pg_lsn as a number: `X/Y` is (X << 32) | Y

    def encode(self) -> str:
        return f"v1{self.system_id:016x}{self.timeline:08x}{self.lsn:016x}"

    @classmethod
    def parse(cls, text: str) -> ConsistencyToken:
        """ValueError for anything that does not have a token's shape."""
        if not _TOKEN.match(text):
            raise ValueError("not a Lethe-Consistency token")
        return cls(system_id=int(text[2:18], 16), timeline=int(text[18:26], 16), lsn=int(text[26:42], 16))

    def covered_by(self, system_id: int, timeline: int, position: int) -> bool | None:
        """Whether a server at `position` (replayed, or written on a primary) holds this token's history: None when
        it cannot tell (another cluster or timeline), so the read goes to the primary."""
        if system_id != self.system_id or timeline != self.timeline:
            return None
        return position >= self.lsn


def end_of_records(lsn: int, *, block_size: int, segment_size: int) -> int:
    """A primary's WAL position as the end of the last record before it.

    `pg_current_wal_insert_lsn()` (what a token holds where commits are asynchronous, app/db/wal.py)
    points past the page header at the start of a page, where no record ends, while a replica reports the end of the
    last record it replayed: the page's start. Without this, a replica that has replayed everything would look a
    header short of it until more WAL came. Positions inside a page are left as they are.
    """
    if lsn % segment_size == LONG_PAGE_HEADER:
        return lsn - LONG_PAGE_HEADER
    if lsn % block_size == SHORT_PAGE_HEADER:
        return lsn - SHORT_PAGE_HEADER
    return lsn


def timeline_of(walfile: str) -> int:
    """The timeline in a WAL file name (`pg_walfile_name()`: eight hex digits of timeline, then the segment)."""
    return int(walfile[:8], 16)


@dataclass(frozen=True)
class ReadFrom:
    """Where a read may be served: `replica` False reads the primary (what a flow that just wrote needs); True lets
    a replica serve it, one that has replayed past `after` when a token is given."""

    replica: bool
    after: ConsistencyToken | None = None


PRIMARY = ReadFrom(replica=False)
ANY_REPLICA = ReadFrom(replica=True)


def replica_after(token: ConsistencyToken | None) -> ReadFrom:
    return ANY_REPLICA if token is None else ReadFrom(replica=True, after=token)
