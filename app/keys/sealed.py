"""What a domain tells `lethe keys verify` about the content it seals: one `SealedColumn` per table.

A domain that seals content declares its tables beside its sealing code (memory: app/memory/repositories/sealing.py),
and the list `verify` walks is the concatenation of those declarations (`SEALED` in app/keys/admin.py), so sealing a
new domain adds one line there. A declaration names the table, a unique key (the scan pages on it), the tenant and
leaf columns, the ciphertext columns, and how to rebuild from a row the binding each ciphertext was sealed for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.db.statements import Row
from app.keys.envelope import Binding

# The binding the ciphertext in `column` of `row` was sealed for.
BindingOf = Callable[[Row, str], Binding]


@dataclass(frozen=True)
class SealedColumn:
    table: str
    key: tuple[str, ...]  # a unique key, in its index's order: the scan pages on it
    ciphertexts: tuple[str, ...]  # the sealed columns (NULL where a row holds none: a tombstone, legacy plaintext)
    binding: BindingOf
    columns: tuple[str, ...] = ()  # what else `binding` reads from the row
    tenant: str = "tenant_id"
    leaf: str = "leaf"
    # Where a column holds a ciphertext only on some rows (sealed in place: the threads' bytea columns hold legacy
    # plaintext where `leaf` is NULL), the SQL condition naming those rows.
    only: str | None = None

    def selected(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.key, self.tenant, self.leaf, *self.columns, *self.ciphertexts)))

    def key_of(self, row: Row) -> tuple[object, ...]:
        return tuple(row[column] for column in self.key)
