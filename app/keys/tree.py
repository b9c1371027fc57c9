"""A shard's keys as a puncturable tree: one seed derives 4,096 data keys; a forget punctures the ones it erased.

A shard holds leaves 0..4095 of a tenant. The cover is a set of nodes `(depth, prefix) -> seed`; a node's children
are HMAC-SHA256(seed, 0) and HMAC-SHA256(seed, 1) (the GGM construction), and a leaf's data key is derived from its
leaf seed. A fresh cover is the one root node. Puncturing a leaf replaces the node above it by the siblings of its
path, so every other leaf derives the same key as before, and nothing in the new cover derives the punctured one:
HMAC cannot be run backwards from a child to its parent.

This is what lets a backup taken before a forget still be read for everything else: the database holds only
ciphertext and leaf numbers, no key material at all, and the current cover (in the provider) derives every leaf that
was not forgotten. The cover grows by at most 12 nodes per punctured leaf, fewer when punctures are neighbours (a
forget's closure is a run of consecutive leaves).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Iterable, Mapping

from app.keys.errors import Erased, Tampered

BITS = 12
LEAVES = 1 << BITS
SEED_BYTES = 32
_MAGIC = b"lethe-cover\x01"
_NODE = struct.Struct(">BH")

Nodes = Mapping[tuple[int, int], bytes]


def fresh() -> dict[tuple[int, int], bytes]:
    return {(0, 0): os.urandom(SEED_BYTES)}


def _child(seed: bytes, bit: int) -> bytes:
    return hmac.digest(seed, bytes([bit]), hashlib.sha256)


def _cover(nodes: Nodes, leaf: int) -> tuple[int, int, bytes] | None:
    """The node above `leaf` (there is at most one: nodes never overlap)."""
    for depth in range(BITS + 1):
        prefix = leaf >> (BITS - depth)
        seed = nodes.get((depth, prefix))
        if seed is not None:
            return depth, prefix, seed
    return None


def derive(nodes: Nodes, leaf: int) -> bytes:
    """The data key of `leaf`; `Erased` when it was punctured."""
    if not 0 <= leaf < LEAVES:
        raise ValueError(f"leaf {leaf} is outside a shard")
    found = _cover(nodes, leaf)
    if found is None:
        raise Erased(f"leaf {leaf} is punctured")
    depth, _, seed = found
    for level in range(depth, BITS):
        seed = _child(seed, (leaf >> (BITS - level - 1)) & 1)
    return hmac.digest(seed, b"lethe-data-key", hashlib.sha256)


def puncture(nodes: Nodes, leaves: Iterable[int]) -> dict[tuple[int, int], bytes]:
    """A new cover that derives every leaf `nodes` derives except `leaves` (already punctured ones are skipped)."""
    result = dict(nodes)
    for leaf in sorted(set(leaves)):
        if not 0 <= leaf < LEAVES:
            raise ValueError(f"leaf {leaf} is outside a shard")
        found = _cover(result, leaf)
        if found is None:
            continue
        depth, prefix, seed = found
        del result[(depth, prefix)]
        for level in range(depth, BITS):
            bit = (leaf >> (BITS - level - 1)) & 1
            prefix = prefix << 1
            result[(level + 1, prefix | (1 - bit))] = _child(seed, 1 - bit)  # the sibling keeps its subtree
            prefix |= bit
            seed = _child(seed, bit)
    return result


def encode(nodes: Nodes) -> bytes:
    body = _MAGIC + struct.pack(">I", len(nodes))
    body += b"".join(_NODE.pack(depth, prefix) + nodes[(depth, prefix)] for depth, prefix in sorted(nodes))
    return body + hashlib.sha256(body).digest()[:16]


def decode(raw: bytes) -> dict[tuple[int, int], bytes]:
    body, digest = raw[:-16], raw[-16:]
    if len(raw) < len(_MAGIC) + 4 + 16 or not hmac.compare_digest(hashlib.sha256(body).digest()[:16], digest):
        raise Tampered("a cover that is torn or not a cover")
    if not body.startswith(_MAGIC):
        raise Tampered("a cover of an unknown format")
    (count,) = struct.unpack_from(">I", body, len(_MAGIC))
    size = _NODE.size + SEED_BYTES
    offset = len(_MAGIC) + 4
    if len(body) != offset + count * size:
        raise Tampered("a cover whose length does not match its node count")
    nodes = {}
    for index in range(count):
        at = offset + index * size
        depth, prefix = _NODE.unpack_from(body, at)
        nodes[(depth, prefix)] = bytes(body[at + _NODE.size : at + size])
    return nodes
