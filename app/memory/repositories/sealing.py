"""Memory values at rest: sealed under their record incarnation's leaf, bound to where they are stored.

One leaf per incarnation of a record (its first write, or its first write after a tombstone): every version of that
incarnation, in `memory_records` and in `memory_versions`, is sealed under it, so the forget that ends the
incarnation punctures one leaf and with it the whole history, in every copy of the database. A write after the
tombstone starts a new incarnation under a new leaf; leaves are never reused.

The binding names the tenant, the table, the row as `[namespace, key, version]` (JSON: no separator a name could
hold makes two rows alike) and the column, so a ciphertext copied to another key, version, table or tenant does not
open (`Tampered`), while one whose leaf was shredded reads as erased (`Erased`). Rows written before migration 0016
hold plaintext in `value` and read as before until the online migration seals them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.db.statements import Row
from app.keys import envelope
from app.keys.content import Sealer
from app.keys.envelope import Binding
from app.keys.errors import Erased
from app.keys.sealed import SealedColumn

RECORDS = "memory_records"
VERSIONS = "memory_versions"


def binding(tenant_id: str, table: str, namespace: str, key: str, version: int) -> Binding:
    return Binding(tenant_id, table, json.dumps([namespace, key, version]), "value")


def _binding_of(table: str) -> Callable[[Row, str], Binding]:
    def of(row: Row, _column: str) -> Binding:
        return binding(row["tenant_id"], table, row["namespace"], row["key"], row["version"])

    return of


# What `lethe keys verify` checks of memory (app/keys/sealed.py): every head and history row holding a ciphertext.
SEALED_COLUMNS = (
    SealedColumn(RECORDS, ("tenant_id", "namespace", "key"), ("value_sealed",), _binding_of(RECORDS),
                 columns=("version",)),
    SealedColumn(VERSIONS, ("tenant_id", "namespace", "key", "version"), ("value_sealed",), _binding_of(VERSIONS)),
)


@dataclass(frozen=True)
class Sealed:
    """One version's value, sealed for its head row and for its history row (two bindings, one leaf)."""

    leaf: int
    head: bytes
    history: bytes


async def seal_version(
    sealer: Sealer, tenant_id: str, namespace: str, key: str, version: int, value: Any, *, leaf: int | None
) -> Sealed:
    """`value` sealed as `version` under the incarnation's `leaf`; None, or a leaf a forget shredded meanwhile (the
    forget won: this write's compare-and-set will not land) or before a backup was restored (the record reads as
    forgotten: this write starts a new incarnation), takes a fresh leaf, never the shredded one."""
    if leaf is not None:
        try:
            return await _seal(sealer, tenant_id, namespace, key, version, value, leaf)
        except Erased:
            pass
    fresh = await sealer.leaf(tenant_id, namespace)
    return await _seal(sealer, tenant_id, namespace, key, version, value, fresh)


async def _seal(
    sealer: Sealer, tenant_id: str, namespace: str, key: str, version: int, value: Any, leaf: int
) -> Sealed:
    head = await sealer.seal_json(leaf, binding(tenant_id, RECORDS, namespace, key, version), value)
    history = await sealer.seal_json(leaf, binding(tenant_id, VERSIONS, namespace, key, version), value)
    return Sealed(leaf=leaf, head=head, history=history)


@dataclass(frozen=True)
class Opened:
    value: Any  # None when erased (or a tombstone's)
    erased: bool  # its leaf was shredded: what a backup restored from before a forget shows


async def open_value(sealer: Sealer, tenant_id: str, table: str, namespace: str, key: str, row: Row) -> Opened:
    """The value of a row selected with `version`, `value` (legacy plaintext) and `value_sealed`."""
    sealed = row["value_sealed"]
    if sealed is None:
        return Opened(row["value"], erased=False)
    try:
        value = await sealer.open_json(binding(tenant_id, table, namespace, key, row["version"]), sealed)
    except Erased:
        return Opened(None, erased=True)
    return Opened(value, erased=False)


_MISSING = object()


async def open_kept(sealer: Sealer, tenant_id: str, table: str, namespace: str, key: str, row: Row
                    ) -> tuple[Opened, int | None]:
    """`open_value`, remembered by the process under the row's leaf for as long as its key (`Sealer.keep`): a search
    opens the same records again and again. Also the leaf (None for a legacy plaintext row). The value is shared:
    never mutate it."""
    sealed = row["value_sealed"]
    if sealed is None:
        return Opened(row["value"], erased=False), None
    sealed = bytes(sealed)
    leaf = envelope.leaf(sealed)
    tag = ("value", table, namespace, key, row["version"], sealed)  # the bytes opened, and where they are stored
    value = sealer.recall(tenant_id, leaf, tag, _MISSING)
    if value is not _MISSING:
        return Opened(value, erased=False), leaf
    opened = await open_value(sealer, tenant_id, table, namespace, key, row)
    if not opened.erased:
        sealer.keep(tenant_id, leaf, tag, opened.value)
    return opened, leaf
