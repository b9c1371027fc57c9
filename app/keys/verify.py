"""`lethe keys verify`: does every ciphertext a live row holds still open with the key store at hand?

For each sealed column a domain declared (app/keys/sealed.py), page through the rows holding a ciphertext and open
each one with a keyring that never creates a shard (`creates=False`), so checking a key store never writes to it.
Each ciphertext lands in one of four counts:
- `ok`: it opens (its leaf derives a key, and the bytes authenticate for the row and column it sits in);
- `erased`: its leaf is punctured though the row still holds it (normal in a database restored from a backup taken
  before a forget: it reads as forgotten);
- `missing`: its leaf's shard is not in the key store at all (a lost or replaced store: never normal);
- `tampered`: its key exists but the bytes do not authenticate there (moved, edited), or the row's `leaf` column
  disagrees with the ciphertext's header.
Missing and tampered fail the command. Memory stays bounded: one page of rows at a time, and the keyring's caches.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from app.db.database import Database
from app.db.statements import Row
from app.keys import envelope
from app.keys import repository as repo
from app.keys.errors import Erased, Missing, Tampered
from app.keys.keyring import Keyring
from app.keys.sealed import SealedColumn

PAGE = 500
OUTCOMES = ("ok", "erased", "missing", "tampered")
_EXAMPLES = 10  # rows named per failing outcome and table: enough to look at, bounded whatever the damage


@dataclass
class TableReport:
    table: str
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)  # outcome -> rows, as "tenant/key.../column"

    def add(self, outcome: str, where: str) -> None:
        self.counts[outcome] += 1
        if outcome != "ok" and len(named := self.examples.setdefault(outcome, [])) < _EXAMPLES:
            named.append(where)


@dataclass
class VerifyReport:
    tables: list[TableReport]

    def total(self, outcome: str) -> int:
        return sum(table.counts[outcome] for table in self.tables)

    @property
    def healthy(self) -> bool:
        """Nothing missing or tampered: erased rows are what a restored backup is expected to hold."""
        return self.total("missing") == 0 and self.total("tampered") == 0


async def verify(
    db: Database, keyring: Keyring, columns: tuple[SealedColumn, ...], *, tenant: str | None
) -> VerifyReport:
    if keyring.creates:
        raise ValueError("verify needs a keyring that does not create shards (Keyring(creates=False))")
    reports = []
    for column in columns:
        report = TableReport(column.table)
        after: tuple[object, ...] | None = None
        while True:
            async with db.pg() as sql:
                rows = await repo.sealed_rows(sql, column, tenant=tenant, after=after, limit=PAGE)
            for row in rows:
                for name in column.ciphertexts:
                    if row[name] is not None:
                        where = "/".join(str(part) for part in (*column.key_of(row), name))
                        report.add(await _outcome(keyring, column, row, name), where)
            if len(rows) < PAGE:
                break
            after = column.key_of(rows[-1])
        reports.append(report)
    return VerifyReport(reports)


async def _outcome(keyring: Keyring, column: SealedColumn, row: Row, name: str) -> str:
    ciphertext = bytes(row[name])
    try:
        if envelope.leaf(ciphertext) != row[column.leaf]:
            return "tampered"  # a listing that trusts the column would leave out, or show, the wrong rows
        await keyring.unseal(column.binding(row, name), ciphertext)
    except Erased:
        return "erased"
    except Missing:
        return "missing"
    except Tampered:
        return "tampered"
    return "ok"
