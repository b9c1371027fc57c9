from __future__ import annotations

import gc

from app.engine.cache_pool import CachePool


class Member:
    def __init__(self, serial: int, nbytes: int) -> None:
        self.serial = serial
        self.nbytes = nbytes
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True


def test_least_recently_used_go_first_and_the_one_in_use_stays() -> None:
    pool = CachePool[Member](budget=250)
    a, b, c = Member(1, 100), Member(2, 100), Member(3, 100)
    for m in (a, b, c):
        pool.touch(m)
    pool.touch(a)  # a is now the most recent: b is the oldest
    assert pool.evict_over_budget(keep=c) == 1
    assert (a.evicted, b.evicted, c.evicted) == (False, True, False)
    assert pool.total_bytes == 200 and len(pool) == 2
    pool.budget = 0
    assert pool.evict_over_budget(keep=c) == 1 and a.evicted and not c.evicted
    assert pool.total_bytes == 100  # the member in use may exceed the budget alone


def test_dropped_members_free_their_place() -> None:
    pool = CachePool[Member](budget=150)
    keep = Member(1, 100)
    pool.touch(keep)
    pool.touch(Member(2, 100))  # the caller drops it without release
    gc.collect()
    assert pool.total_bytes == 100
    assert pool.evict_over_budget(keep=keep) == 0 and not keep.evicted


def test_drop_and_evict_all() -> None:
    pool = CachePool[Member](budget=1000)
    a, b = Member(1, 10), Member(2, 10)
    pool.touch(a)
    pool.touch(b)
    pool.drop(a)
    assert len(pool) == 1
    pool.evict_all()
    assert b.evicted and not a.evicted and len(pool) == 0
