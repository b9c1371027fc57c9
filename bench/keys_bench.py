"""What erasure at rest costs in the process: sealing, deriving keys, shredding, and ranking encrypted embeddings.

`python -m bench.keys_bench [--sizes 1000 10000] [--live 10000 100000] [--repeats 20]`

Everything runs on the `local` provider in a temporary directory, with real AES-256-GCM and real files (fsync).
- seal / unseal: a 300-byte artifact text under a cached key (what every content write and read adds);
- key derivation: a leaf's key from a cached cover (a key-cache miss), and a cover read from the key store (a
  cover-cache miss: one file read and decode);
- shred: one forget's closure (20 consecutive leaves) punctured in a tenant holding `--live` leaves, and an "epoch"
  alternative for comparison: the time to re-wrap `--live` 32-byte data keys in process (what a wrapped-key
  hierarchy pays on every rotation, before any database write);
- rotation: what `lethe keys rotate` does to the key store once no shred is pending (`KeyAdmin.rotate`: every shard
  of the tenant swept, the leftovers of killed writes destroyed), for `--live` leaves (one shard per 4,096);
- top-k: a session's `--sizes` encrypted 384-dimension float32 embeddings decrypted with cached keys and ranked
  (exact top 5, numpy), sealed one per row or in blocks of 256 vectors, against ranking the same vectors in the
  clear (the decryption's share).
Medians over `--repeats`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.keys import envelope, tree
from app.keys.envelope import Binding
from app.keys.keyring import Keyring
from app.keys.local import LocalProvider

DIMS = 384
TOP_K = 5
BLOCK = 256
TENANT = "ten_bench"


def median_us(action: Callable[[], object], repeats: int, per: int = 1) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) / per)
    return statistics.median(times) * 1e6


def content(repeats: int) -> None:
    key = envelope.cipher(os.urandom(32))
    here = Binding(TENANT, "artifacts", "art_01", "text")
    text = os.urandom(150).hex().encode()
    sealed = envelope.seal(key, 1, here, text)
    seal = median_us(lambda: [envelope.seal(key, 1, here, text) for _ in range(1000)], repeats, 1000)
    unseal = median_us(lambda: [envelope.unseal(key, here, sealed) for _ in range(1000)], repeats, 1000)
    print(f"seal 300 B: {seal:.1f} µs; unseal: {unseal:.1f} µs")


def derivation(directory: Path, repeats: int) -> None:
    provider = LocalProvider(directory)
    provider.write(TENANT, 0, tree.puncture(tree.fresh(), range(100, 140)), 0)
    cover = provider.read(TENANT, 0)
    assert cover is not None
    nodes = cover.nodes
    per_leaf = median_us(lambda: [tree.derive(nodes, leaf) for leaf in range(1000, 2000)], repeats, 1000)
    per_read = median_us(lambda: [provider.read(TENANT, 0) for _ in range(100)], repeats, 100)
    print(f"derive a leaf key (cover cached): {per_leaf:.1f} µs; read a cover from the key store: {per_read:.1f} µs")


def shredding(directory: Path, live: int, repeats: int) -> None:
    keyring = Keyring(LocalProvider(directory / f"live-{live}"))
    for shard in range((live + tree.LEAVES - 1) // tree.LEAVES):  # every shard the tenant's leaves fill
        asyncio.run(keyring.key(TENANT, shard * tree.LEAVES))
    closures = iter(range(0, live - 20, max(20, live // (repeats + 1))))

    def one_forget() -> None:
        start = next(closures)
        asyncio.run(keyring.shred(TENANT, range(start, start + 20)))

    shred = median_us(one_forget, repeats) / 1000
    wrapping, keys = AESGCM(os.urandom(32)), [os.urandom(32) for _ in range(live)]
    nonce = os.urandom(12)
    rewrap = median_us(lambda: [wrapping.encrypt(nonce, key, None) for key in keys], max(3, repeats // 5)) / 1000
    shards = (live + tree.LEAVES - 1) // tree.LEAVES
    provider = keyring.provider
    rotate = median_us(lambda: [provider.sweep(TENANT, shard) for shard in range(shards)], repeats) / 1000
    print(f"{live} live leaves: shred one forget (20 leaves, fsynced) {shred:.2f} ms;"
          f" re-wrap {live} data keys in process (epoch alternative, no database writes) {rewrap:.1f} ms;"
          f" rotate (`lethe keys rotate`'s sweep of the {shards} shards) {rotate:.2f} ms")


def ranking(size: int, repeats: int) -> None:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((size, DIMS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    key = envelope.cipher(os.urandom(32))  # one per artifact in the service: cached AEADs, same cost per row

    def sealed(table: str, row: int, payload: bytes) -> tuple[Binding, bytes]:
        here = Binding(TENANT, table, f"{table}_{row}", "embedding")
        return here, envelope.seal(key, row, here, payload)

    rows = [sealed("artifacts", i, vectors[i].tobytes()) for i in range(size)]
    blocks = [sealed("embedding_blocks", i, vectors[i : i + BLOCK].tobytes()) for i in range(0, size, BLOCK)]
    query = vectors[0]

    def top(matrix: np.ndarray) -> np.ndarray:
        scores = matrix @ query
        best = np.argpartition(-scores, TOP_K)[:TOP_K]
        return best[np.argsort(-scores[best])]

    def encrypted() -> np.ndarray:
        matrix = np.frombuffer(b"".join(envelope.unseal(key, b, c) for b, c in rows), dtype=np.float32)
        return top(matrix.reshape(size, DIMS))

    def in_blocks() -> np.ndarray:
        matrix = np.frombuffer(b"".join(envelope.unseal(key, b, c) for b, c in blocks), dtype=np.float32)
        return top(matrix.reshape(size, DIMS))

    assert list(encrypted()) == list(top(vectors)) == list(in_blocks())
    clear, per_row = median_us(lambda: top(vectors), repeats) / 1000, median_us(encrypted, repeats) / 1000
    blocked = median_us(in_blocks, repeats) / 1000
    print(f"top-{TOP_K} of {size} embeddings: in the clear {clear:.2f} ms, decrypted one per row then ranked "
          f"{per_row:.2f} ms, decrypted in blocks of {BLOCK} then ranked {blocked:.2f} ms")


def main(sizes: list[int], live: list[int], repeats: int) -> None:
    content(repeats)
    with tempfile.TemporaryDirectory() as scratch:
        derivation(Path(scratch) / "keys", repeats)
        for count in live:
            shredding(Path(scratch), count, repeats)
    for size in sizes:
        ranking(size, repeats)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--live", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    main(args.sizes, args.live, args.repeats)
