"""The one interface to where key material lives, outside PostgreSQL: a cover per (tenant, shard).

PostgreSQL holds ciphertext and leaf numbers only, so no copy of it (data files, WAL, replicas, backups, archives)
holds anything that decrypts. The provider holds each shard's current cover (`tree`) under a version number.
`write` is compare-and-set on that version, so processes on one machine (`local`) or on many hosts (`openbao`)
puncture the same shard without losing each other's punctures; after a write switches to the new cover, the
provider destroys the old one (the copy that still derived what was punctured). A write killed anywhere leaves the
old cover or the new one, never neither, and `sweep` finishes destroying what a killed write left behind.

Calls are synchronous and may block (files, HTTP); async callers run them in a thread (`keyring`). Every method
raises `Unavailable` when the provider cannot be reached, and `Tampered` for a cover that is not a whole cover.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from app.keys.tree import Nodes

# A seam for crash tests and tracing: called with a step's name right after the step is durable.
Step = Callable[[str], None]


def no_step(name: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Cover:
    version: int  # the provider's version of this shard's cover, 1 and up
    nodes: Nodes


class KeyProvider(Protocol):
    @property
    def name(self) -> str: ...

    def identity(self) -> str:
        """The key store's id, made on first use. The database records it, and a process whose provider answers
        another id refuses to start: a wiped or swapped key store would otherwise read as "never written" and
        start new covers, and every old ciphertext would fail."""
        ...

    def read(self, tenant: str, shard: int) -> Cover | None:
        """The shard's current cover; None when the shard was never written (never when it was punctured whole)."""
        ...

    def write(self, tenant: str, shard: int, nodes: Nodes, expected: int) -> Cover | None:
        """Stores `nodes` as the shard's cover if its version is still `expected` (0: the shard does not exist yet),
        then destroys the cover it replaced. None when another writer got there first: read again and redo."""
        ...

    def sweep(self, tenant: str, shard: int) -> None:
        """Destroys what a killed write left of the shard's replaced covers (idempotent)."""
        ...
