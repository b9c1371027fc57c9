"""Consistency tokens as data: their text form, what they accept, how the client orders them, and the WAL position
arithmetic they rest on (no server: the behaviour against real replicas is test_replica_consistency.py)."""

from __future__ import annotations

import pytest
from lethe_client._consistency import TokenKeeper, newer

from app.db.consistency import ConsistencyToken, end_of_records, timeline_of
from bench.memory_history import Op, check_history

SYSTEM = 7715035792987635977


def tok(system: int, timeline: int, lsn: int) -> str:
    return ConsistencyToken(system_id=system, timeline=timeline, lsn=lsn).encode()


def test_a_token_is_v1_and_forty_hex_digits() -> None:
    """Letters and digits only, so it travels in any header; `X/Y` of PostgreSQL is the number (X << 32) | Y."""
    token = ConsistencyToken(system_id=SYSTEM, timeline=3, lsn=(0x16 << 32) | 0xB374D848)
    assert token.encode() == f"v1{SYSTEM:016x}00000003" + "00000016b374d848"
    assert ConsistencyToken.parse(token.encode()) == token
    biggest = "v1" + "f" * 40  # every string of the shape is a token (of no real cluster: it reads the primary)
    assert ConsistencyToken.parse(biggest) == ConsistencyToken(2**64 - 1, 2**32 - 1, 2**64 - 1)


@pytest.mark.parametrize("text", [
    "", "garbage", "v2" + "0" * 40, "v1" + "0" * 39, "v1" + "0" * 41, "v1" + "0" * 39 + "g", " v1" + "0" * 40,
    "v1" + "0" * 39 + "A",  # lowercase only: one spelling per token
    f"v1:{SYSTEM}:1:0/1",
])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        ConsistencyToken.parse(text)


def test_coverage_needs_the_same_cluster_and_timeline() -> None:
    token = ConsistencyToken(system_id=SYSTEM, timeline=2, lsn=1000)
    assert token.covered_by(SYSTEM, 2, 1000) is True
    assert token.covered_by(SYSTEM, 2, 999) is False
    assert token.covered_by(SYSTEM, 1, 5000) is None  # a position on another timeline says nothing
    assert token.covered_by(SYSTEM, 3, 5000) is None
    assert token.covered_by(SYSTEM + 1, 2, 5000) is None  # another cluster


def test_an_insert_position_past_a_page_header_is_the_end_of_the_last_record() -> None:
    """Measured on a fresh primary: insert LSN 0/3000028 (a segment's start plus its long page header) while its
    replica, fully caught up, reported 0/3000000."""
    segment, block = 16 * 1024 * 1024, 8192
    page = 0x3000000 + 5 * block
    assert end_of_records(0x3000028, block_size=block, segment_size=segment) == 0x3000000
    assert end_of_records(page + 24, block_size=block, segment_size=segment) == page  # a short page header
    assert end_of_records(page + 32, block_size=block, segment_size=segment) == page + 32  # inside a page: as is
    assert timeline_of("000000020000000000000003") == 2


def test_the_client_keeps_the_newest_token() -> None:
    early, late = tok(SYSTEM, 1, 0x100), tok(SYSTEM, 1, 0x200)
    promoted = tok(SYSTEM, 2, 0x10)
    assert newer(None, early) == early
    assert newer(late, early) == late  # an answer that arrives late does not move the client back
    assert newer(early, late) == late
    assert newer(late, promoted) == promoted  # a newer timeline is later, whatever its position
    assert newer(promoted, late) == promoted
    other_cluster = tok(1, 1, 1)
    assert newer(late, other_cluster) == other_cluster  # the server now answering made it
    keeper = TokenKeeper()
    assert keeper.read_headers() == {}
    for token in (early, late, early, None):
        keeper.observe(token)
    assert keeper.read_headers() == {"Lethe-Consistency": late}


def test_per_reader_history_holds_a_read_to_its_own_readers_forgets() -> None:
    """A read that missed another client's forget is eventual consistency, not a violation; one that missed its own
    reader's forget is."""
    ops = [
        Op("forget", "k", 0.0, 1.0, 200, version=2, reader="a"),
        Op("read", "k", 2.0, 3.0, 200, version=1, tag=None, reader="b"),  # b never saw a's forget
    ]
    counts = check_history(ops, per_reader=True)
    assert counts["stale_reads"] == 0 and counts["resurrections"] == 0
    assert counts["reads_behind_others_forgets"] == 1
    assert check_history(ops)["stale_reads"] == 1  # held to every forget, it is one
    ops.append(Op("read", "k", 2.0, 3.0, 200, version=1, tag=None, reader="a"))
    counts = check_history(ops, per_reader=True)
    assert counts["stale_reads"] == 1 and counts["resurrections"] == 1


def test_what_sends_a_read_from_the_replica_to_the_primary() -> None:
    """Anything from the replica's side (connection, database) reads the primary instead; the request's own errors
    (a domain error such as a 404) are the answer."""
    import asyncpg
    from sqlalchemy.exc import OperationalError

    from app.db.replicas import replica_failed
    from app.errors import NotFound

    for failure in (
        ConnectionRefusedError(), TimeoutError(), asyncpg.exceptions.CannotConnectNowError("starting up"),
        asyncpg.exceptions.SerializationError("canceling statement due to conflict with recovery"),
        asyncpg.exceptions.UndefinedTableError('relation "memory_records" does not exist'),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
        OperationalError("SELECT 1", {}, ConnectionResetError()),
    ):
        assert replica_failed(failure), failure
    assert not replica_failed(NotFound("no session"))
    assert not replica_failed(ValueError("a bug"))
