"""SQL about a server's place in the WAL: where a primary has written to, where a replica has replayed to.

Every function takes `Sql` (app/db/statements.py), so the same statement runs on the memory hot path's asyncpg
connections and inside an ORM session. Everything read here is visible to an ordinary role except
`pg_stat_wal_receiver.received_tli`, which needs `pg_read_all_stats` (or `pg_monitor`): without it a replica's
timeline is read from its last restartpoint, a lower bound, which is safe (tokens of a newer timeline then read the
primary until the replica's next restartpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.db.consistency import ConsistencyToken, end_of_records, timeline_of
from app.db.statements import Sql, Statement

# One statement for both kinds of server, so a replica URL that now names a promoted server still answers.
# The CASE branches are evaluated lazily: `pg_current_wal_*_lsn()` and `pg_walfile_name()` fail in recovery.
# On a primary: where WAL is flushed to. A commit with synchronous_commit on (or local, remote_*) returns, and becomes
# visible to others, only once its commit record is flushed, so the flush position read after it covers it; and a
# replica can replay only flushed WAL, so a token that named the *insert* position would make reads wait for other
# transactions' commits still flushing. Where commits are asynchronous (synchronous_commit off) a visible commit may
# not be flushed yet: there the insert position, which always covers it.
_POSITION = Statement(
    """
    SELECT s.system_identifier AS system_id,
           r.standby,
           CASE WHEN r.standby THEN pg_last_wal_replay_lsn()
                WHEN current_setting('synchronous_commit') = 'off' THEN pg_current_wal_insert_lsn()
                ELSE pg_current_wal_flush_lsn() END AS position,
           CASE WHEN r.standby
                THEN coalesce((SELECT received_tli FROM pg_stat_wal_receiver),
                              (SELECT timeline_id FROM pg_control_checkpoint()))::bigint END AS standby_timeline,
           CASE WHEN NOT r.standby THEN pg_walfile_name(pg_current_wal_insert_lsn()) END AS walfile,
           current_setting('wal_block_size')::int AS block_size,
           pg_size_bytes(current_setting('wal_segment_size')) AS segment_size
      FROM pg_control_system() AS s, (SELECT pg_is_in_recovery() AS standby) AS r
    """
)

_REPLAY = Statement(
    """
    SELECT pg_last_wal_replay_lsn() AS replayed,
           extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8 AS since_last_replay_s
    """
)

_HEAD = Statement("SELECT pg_current_wal_lsn() AS head")


@dataclass(frozen=True)
class Position:
    """Where a server stands: the end of the last WAL record a replica replayed, or a primary inserted."""

    system_id: int
    timeline: int
    lsn: int
    standby: bool

    def token(self) -> ConsistencyToken:
        return ConsistencyToken(system_id=self.system_id, timeline=self.timeline, lsn=self.lsn)


async def position(sql: Sql) -> Position:
    row = await sql.one(_POSITION, {})
    assert row is not None
    standby = bool(row["standby"])
    lsn = int(row["position"] or 0)  # NULL only on a replica that has replayed nothing yet
    if standby:
        timeline = int(row["standby_timeline"] or 0)
    else:
        timeline = timeline_of(row["walfile"])
        lsn = end_of_records(lsn, block_size=row["block_size"], segment_size=int(row["segment_size"]))
    return Position(system_id=int(row["system_id"]), timeline=timeline, lsn=lsn, standby=standby)


@dataclass(frozen=True)
class Replay:
    replayed: int | None  # None: the server is not (or no longer) a replica
    since_last_replay_s: float | None  # None: nothing replayed since it started


async def replay(sql: Sql) -> Replay:
    row = await sql.one(_REPLAY, {})
    assert row is not None
    replayed = row["replayed"]
    return Replay(None if replayed is None else int(replayed), row["since_last_replay_s"])


async def head(sql: Sql) -> int:
    """How far the primary has written its WAL (what a replica's lag is measured against)."""
    row = await sql.one(_HEAD, {})
    assert row is not None
    return int(row["head"])
