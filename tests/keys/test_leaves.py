"""Leaves: never handed out twice, consecutive within a stream, reserved a block at a time, each next block of a
stream twice the last up to a cap."""

from __future__ import annotations

import asyncio

import pytest

from app.keys.leaves import Leaves


class Counter:
    """The tenant rows' counters (what the repository's UPDATE ... RETURNING does)."""

    def __init__(self) -> None:
        self.next: dict[str, int] = {}
        self.calls = 0

    async def reserve(self, tenant: str, count: int) -> int:
        self.calls += 1
        first = self.next.get(tenant, 0)
        await asyncio.sleep(0)  # another task may run here, as during a database round trip
        self.next[tenant] = first + count
        return first


def test_streams_get_runs_and_no_leaf_twice() -> None:
    counter = Counter()
    leaves = Leaves(counter.reserve, block=4, streams=2)

    async def run() -> list[tuple[str, int]]:
        handed = []
        for stream in ["s1", "s2", "s1", "s1", "s1", "s1", "s3", "s2"]:
            handed.append((stream, await leaves.next("ten_a", stream)))
        handed.append(("other tenant", await leaves.next("ten_b", "s1")))
        return handed

    handed = asyncio.run(run())
    assert [leaf for stream, leaf in handed if stream == "s1"] == [0, 1, 2, 3, 8]  # a run, then a new block (of 8)
    assert [leaf for stream, leaf in handed if stream == "s2"] == [4, 20]  # s2 went cold (2 streams kept): 4 again
    assert ("other tenant", 0) in handed  # tenants count apart
    ten_a = [leaf for stream, leaf in handed if stream != "other tenant"]
    assert len(set(ten_a)) == len(ten_a)


def test_concurrent_tasks_never_share_a_leaf() -> None:
    counter = Counter()
    leaves = Leaves(counter.reserve, block=3)

    async def run() -> list[int]:
        return list(await asyncio.gather(*(leaves.next("ten_a", i % 2) for i in range(50))))

    handed = asyncio.run(run())
    assert len(set(handed)) == 50
    assert counter.calls == 2 * 4  # 25 per stream: blocks of 3, 6, 12 and 24


def test_a_stream_that_keeps_writing_reserves_ever_larger_blocks_up_to_the_cap() -> None:
    counter = Counter()
    sizes: list[int] = []

    async def reserve(tenant: str, count: int) -> int:
        sizes.append(count)
        return await counter.reserve(tenant, count)

    leaves = Leaves(reserve, block=2, most=16)

    async def run() -> list[int]:
        return [await leaves.next("ten_a", "thread") for _ in range(100)]

    handed = asyncio.run(run())
    assert handed == list(range(100))  # one run: every block follows the last
    assert sizes == [2, 4, 8, *[16] * 6]  # 14, then 16 at a time: 110 reserved for 100


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        Leaves(Counter().reserve, block=0)
    with pytest.raises(ValueError):
        Leaves(Counter().reserve, block=8, most=4)
