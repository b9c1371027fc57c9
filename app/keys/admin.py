"""The operator's key commands, `lethe keys status | rotate | verify` (app/cli.py), over every domain's content.

This module sits above the forget machinery (test_layers: its own unit, layer 6) because `rotate` settles forgets'
pending shreds with the same `Shredder` the forget worker uses; the rest of app/keys stays below the repositories.

`SEALED` is the list `verify` walks: each domain that seals content adds its declarations (app/keys/sealed.py) here.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass

from app.db.database import Database
from app.forget.repositories import jobs as jobs_repo
from app.forget.shredding import Shredder
from app.keys import tree, verify
from app.keys.errors import Tampered
from app.keys.keyring import Keyring
from app.keys.provider import KeyProvider
from app.keys.sealed import SealedColumn
from app.keys.verify import OUTCOMES, VerifyReport
from app.memory.repositories.sealing import SEALED_COLUMNS as MEMORY
from app.openai_compat.repository import SEALED_COLUMNS as OPENAI_OBJECTS
from app.sessions.repositories.sealing import SEALED_COLUMNS as ARTIFACTS
from app.sessions.repositories.settings_sealing import SEALED_COLUMNS as SESSION_SETTINGS
from app.tenants import repository as tenants_repo

SEALED: tuple[SealedColumn, ...] = (*MEMORY, *ARTIFACTS, *SESSION_SETTINGS, *OPENAI_OBJECTS)


class UnknownTenant(LookupError):
    pass


@dataclass(frozen=True)
class TenantKeys:
    """One tenant's line of `lethe keys status`."""

    id: str
    name: str
    leaves: int  # handed out so far (the tenant's leaf counter)
    shards: int  # the shards those leaves fall in
    present: int  # of those, the shards whose cover is in the key store (a shard is written on its first key)
    damaged: int  # shards whose cover is there but is not a whole cover (Tampered: `lethe keys verify` says what)
    pending_shreds: int  # forget jobs whose leaves are not punctured yet
    oldest_pending_s: float | None
    horizon_s: int

    @property
    def overdue(self) -> bool:
        """A pending shred older than the erasure horizon: the promise made to the user is broken."""
        return self.oldest_pending_s is not None and self.oldest_pending_s > self.horizon_s


@dataclass(frozen=True)
class Rotation:
    settled: int  # pending shreds completed now
    pending: int  # still pending (the provider refused them: see the log)
    swept: int  # shards swept of what killed writes left


class KeyAdmin:
    def __init__(self, db: Database, provider: KeyProvider, shredder: Shredder, *, horizon_s: int) -> None:
        self.db = db
        self.provider = provider
        self.shredder = shredder
        self.horizon_s = horizon_s

    async def _tenants(self, name: str | None) -> list[tuple[str, str, int]]:
        async with self.db.single_statement() as session:
            found = [(t.id, t.name, t.next_leaf) for t in await tenants_repo.every(session, name)]
        if name is not None and not found:
            raise UnknownTenant(f"no tenant named {name!r}")
        return found

    async def status(self, tenant: str | None = None) -> list[TenantKeys]:
        async with self.db.pg() as sql:
            pending = await jobs_repo.pending_shreds_by_tenant(sql)
        lines = []
        for tenant_id, name, leaves in await self._tenants(tenant):
            shards = _shards(leaves)
            present = damaged = 0
            for shard in range(shards):
                try:
                    present += await asyncio.to_thread(self.provider.read, tenant_id, shard) is not None
                except Tampered:  # counted, so the status of every other shard and tenant is still shown
                    damaged += 1
            waiting = pending.get(tenant_id)
            lines.append(TenantKeys(
                tenant_id, name, leaves, shards, present, damaged, waiting.jobs if waiting else 0,
                waiting.oldest_s if waiting else None, self.horizon_s,
            ))
        return lines

    async def rotate(self) -> Rotation:
        """Every pending shred now, then every shard swept. Idempotent: run again, it finds nothing to do."""
        settled = 0
        while done := await self.shredder.sweep():  # a round that completes nothing: the rest are refused for now
            settled += done
        async with self.db.pg() as sql:
            pending = sum(s.jobs for s in (await jobs_repo.pending_shreds_by_tenant(sql)).values())
        swept = 0
        for tenant_id, _name, leaves in await self._tenants(None):
            for shard in range(_shards(leaves)):
                await asyncio.to_thread(self.provider.sweep, tenant_id, shard)
                swept += 1
        return Rotation(settled, pending, swept)

    async def verify(self, tenant: str | None = None) -> VerifyReport:
        tenant_id = None if tenant is None else (await self._tenants(tenant))[0][0]
        # A keyring of its own that never creates a shard: a check must not write to the store it checks.
        return await verify.verify(self.db, Keyring(self.provider, creates=False), SEALED, tenant=tenant_id)


def _shards(leaves: int) -> int:
    return -(-leaves // tree.LEAVES)


# What the commands print: one line per tenant or table for a person, one JSON document for a script.


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def status_text(lines: list[TenantKeys]) -> str:
    if not lines:
        return "no tenants"
    out = []
    for t in lines:
        pending = "no pending shred" if not t.pending_shreds else (
            f"{t.pending_shreds} pending shred(s), oldest {_age(t.oldest_pending_s or 0.0)}"
            + (f": PAST THE ERASURE HORIZON ({t.horizon_s} s)" if t.overdue else f" (horizon {t.horizon_s} s)")
        )
        damaged = f" ({t.damaged} DAMAGED)" if t.damaged else ""
        out.append(f"{t.name} ({t.id}): {t.leaves} leaves, {t.present}/{t.shards} shards in the key store{damaged}, "
                   f"{pending}")
    return "\n".join(out)


def status_json(lines: list[TenantKeys]) -> str:
    return json.dumps({"tenants": [{**asdict(t), "overdue": t.overdue} for t in lines]}, indent=2)


def rotation_text(done: Rotation) -> str:
    left = f", {done.pending} still pending (the key provider refused them: see the log)" if done.pending else ""
    return f"{done.settled} pending shred(s) completed{left}; {done.swept} shard(s) swept"


def rotation_json(done: Rotation) -> str:
    return json.dumps(asdict(done), indent=2)


def verify_text(found: VerifyReport) -> str:
    out = []
    for table in found.tables:
        counts = ", ".join(f"{table.counts[o]} {o}" for o in OUTCOMES)
        out.append(f"{table.table}: {counts}")
        out += [f"  {outcome}: {where}" for outcome, named in table.examples.items() for where in named]
    out.append("ok: every live ciphertext opens or reads as erased" if found.healthy else
               "FAILED: some content is tampered, or its key is missing from the key store")
    return "\n".join(out)


def verify_json(found: VerifyReport) -> str:
    return json.dumps({
        "healthy": found.healthy,
        "tables": [{"table": t.table, **{o: t.counts[o] for o in OUTCOMES}, "examples": t.examples}
                   for t in found.tables],
    }, indent=2)
