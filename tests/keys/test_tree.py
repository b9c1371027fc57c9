"""The puncturable cover: survivors keep their keys, punctured leaves are underivable, and it stays small."""

from __future__ import annotations

import hashlib
import hmac
import random

import pytest

from app.keys import tree
from app.keys.errors import Erased, Tampered


def _all(nodes: tree.Nodes) -> dict[int, bytes | None]:
    keys: dict[int, bytes | None] = {}
    for leaf in range(tree.LEAVES):
        try:
            keys[leaf] = tree.derive(nodes, leaf)
        except Erased:
            keys[leaf] = None
    return keys


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_punctures_erase_exactly_their_leaves(seed: int) -> None:
    rng = random.Random(seed)
    cover = tree.fresh()
    before = _all(cover)
    assert None not in before.values() and len(set(before.values())) == tree.LEAVES
    gone: set[int] = set()
    for _ in range(5):  # several forgets in a row, each on the previous cover
        batch = set(rng.sample(range(tree.LEAVES), rng.randint(1, 200)))
        start = rng.randrange(tree.LEAVES - 50)
        batch |= set(range(start, start + rng.randint(1, 50)))  # a closure: a run of neighbours
        cover = tree.puncture(cover, batch)
        gone |= batch
    after = _all(cover)
    for leaf in range(tree.LEAVES):
        assert after[leaf] == (None if leaf in gone else before[leaf]), leaf


def test_no_seed_on_a_punctured_path_survives() -> None:
    """Every ancestor seed of a punctured leaf is gone from the cover (only siblings remain)."""
    cover = tree.fresh()
    (root,) = cover.values()
    leaf = 1234
    path = [root]
    for level in range(tree.BITS):
        path.append(hmac.digest(path[-1], bytes([(leaf >> (tree.BITS - level - 1)) & 1]), hashlib.sha256))
    punctured = tree.puncture(cover, [leaf])
    assert not set(path) & set(punctured.values())
    assert len(punctured) == tree.BITS


def test_order_and_repetition_do_not_matter() -> None:
    cover = tree.fresh()
    once = tree.puncture(cover, [5, 9, 4000])
    assert tree.puncture(tree.puncture(tree.puncture(cover, [4000]), [9]), [5, 5]) == once
    assert tree.puncture(once, [9]) == once


def test_neighbours_share_their_path() -> None:
    run = tree.puncture(tree.fresh(), range(1024, 1024 + 256))  # an aligned run costs one subtree
    assert len(run) == tree.BITS - 8
    anywhere = tree.puncture(tree.fresh(), range(1000, 1100))
    assert len(anywhere) <= 2 * tree.BITS


def test_whole_shard_punctured_is_empty() -> None:
    assert tree.puncture(tree.fresh(), range(tree.LEAVES)) == {}


def test_encoding_round_trips_and_refuses_damage() -> None:
    cover = tree.puncture(tree.fresh(), [1, 2, 3, 700])
    raw = tree.encode(cover)
    assert tree.decode(raw) == cover
    assert tree.decode(tree.encode({})) == {}
    for damaged in (raw[:-1], b"\0" * len(raw), raw[:10] + bytes([raw[10] ^ 1]) + raw[11:]):
        with pytest.raises(Tampered):
            tree.decode(damaged)


def test_leaves_outside_a_shard_are_refused() -> None:
    with pytest.raises(ValueError):
        tree.derive(tree.fresh(), tree.LEAVES)
    with pytest.raises(ValueError):
        tree.puncture(tree.fresh(), [-1])
