"""The operator's key commands, `lethe keys status | rotate | verify | seal` (app/cli.py), over every domain's content.

This module sits above the forget machinery (test_layers: its own unit, layer 6) because `rotate` settles forgets'
pending shreds with the same `Shredder` the forget worker uses; the rest of app/keys stays below the repositories.

`SEALED` is the list `verify` walks: each domain that seals content adds its declarations (app/keys/sealed.py) here;
`LEGACY` the list `seal` walks: each domain whose rows from before its sealing migration hold plaintext adds how to
seal a page of them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from app.db import legacy as legacy_json
from app.db import maintenance
from app.db.database import Database
from app.db.legacy import LegacyJson
from app.db.statements import Sql
from app.forget.repositories import legacy as jobs_legacy
from app.forget.repositories.sealing import SEALED_COLUMNS as FORGET_JOBS
from app.forget.shredding import Shredder
from app.keys import tree, verify
from app.keys.content import Sealer
from app.keys.errors import Tampered
from app.keys.keyring import Keyring
from app.keys.provider import KeyProvider
from app.keys.sealed import SealedColumn
from app.keys.verify import OUTCOMES, VerifyReport
from app.memory.repositories import legacy as memory_legacy
from app.memory.repositories.sealing import SEALED_COLUMNS as MEMORY
from app.openai_compat.repository import LEGACY as OPENAI_LEGACY
from app.openai_compat.repository import SEALED_COLUMNS as OPENAI_OBJECTS
from app.sessions.repositories import legacy as artifacts_legacy
from app.sessions.repositories.sealing import SEALED_COLUMNS as ARTIFACTS
from app.sessions.repositories.settings_sealing import LEGACY as SETTINGS_LEGACY
from app.sessions.repositories.settings_sealing import SEALED_COLUMNS as SESSION_SETTINGS
from app.tenants import repository as tenants_repo
from app.threads.repositories import legacy as threads_legacy
from app.threads.repositories.sealing import SEALED_COLUMNS as THREADS

SEALED: tuple[SealedColumn, ...] = (
    *MEMORY, *ARTIFACTS, *SESSION_SETTINGS, *OPENAI_OBJECTS, *THREADS, *FORGET_JOBS
)


@dataclass(frozen=True)
class Legacy:
    """A domain's plaintext from before its sealing migration: how to seal the page after a cursor (in the caller's
    transaction; the page answers `sealed` and `after`, None once the pass is over), and how much is left."""

    name: str
    first: Any  # the cursor before every row
    seal_page: Callable[[Sql, Sealer, Any, int], Awaitable[Any]]
    left: Callable[[Sql], Awaitable[int]]
    tables: tuple[str, ...]


@dataclass(frozen=True)
class _JsonPage:
    sealed: int
    after: str | None


def _json(table: LegacyJson) -> Legacy:
    """A domain's id-keyed JSON content (app/db/legacy.py) as one more `Legacy` to walk."""

    async def seal_page(sql: Sql, sealer: Sealer, after: Any, limit: int) -> _JsonPage:
        return _JsonPage(*await legacy_json.seal_page(sql, sealer, table, after, limit))

    async def left(sql: Sql) -> int:
        return await legacy_json.left(sql, table)

    return Legacy(table.table, "", seal_page, left, (table.table,))


LEGACY: tuple[Legacy, ...] = (
    Legacy("memory", memory_legacy.FIRST, memory_legacy.seal_page, memory_legacy.left, memory_legacy.TABLES),
    Legacy("artifacts", artifacts_legacy.FIRST, artifacts_legacy.seal_page, artifacts_legacy.left,
           artifacts_legacy.TABLES),
    Legacy("threads", threads_legacy.FIRST, threads_legacy.seal_page, threads_legacy.left, threads_legacy.TABLES),
    *(_json(table) for table in (*SETTINGS_LEGACY, *OPENAI_LEGACY)),
    Legacy("forget_jobs", jobs_legacy.FIRST, jobs_legacy.seal_page, jobs_legacy.left, jobs_legacy.TABLES),
)
Vacuum = Literal["plain", "full", "none"]


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
    pending_shreds: int  # forget jobs and thread removals (app/threads/shredding.py) whose leaves are not shredded
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


@dataclass(frozen=True)
class Sealing:
    sealed: dict[str, int]  # rows sealed, per domain
    left: dict[str, int]  # rows still in the clear (locked by a writer through every pass: run it again)
    vacuumed: list[str] = field(default_factory=list)
    vacuum: Vacuum = "plain"


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
            pending = await self.shredder.pending(sql)
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
            pending = sum(s.jobs for s in (await self.shredder.pending(sql)).values())
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

    async def seal(self, *, batch: int = 200, vacuum: Vacuum = "plain") -> Sealing:
        """Seal every row a domain wrote in the clear before its sealing migration, online: a page per transaction,
        rows a writer holds skipped and taken by the next pass; passes repeat while one seals something and some
        are left. Resumable: a run stopped anywhere (a kill included) left only whole pages sealed, and a new run
        finds the rest. Then VACUUM the tables: "plain" frees the dead tuples' space for reuse, "full" rewrites the
        tables (an exclusive lock while it runs) so their files hold no dead tuple; neither reaches the WAL already
        written, replicas' or backups' copies (docs/erasure-at-rest.md, "Upgrading")."""
        sealer = self.shredder.sealer
        sealed: dict[str, int] = {}
        left: dict[str, int] = {}
        for domain in LEGACY:
            total = 0
            while True:
                passed, after = 0, domain.first
                while after is not None:
                    async with self.db.pg_transaction() as sql:
                        page = await domain.seal_page(sql, sealer, after, batch)
                    passed, after = passed + page.sealed, page.after
                total += passed
                async with self.db.pg() as sql:
                    left[domain.name] = await domain.left(sql)
                if not passed or not left[domain.name]:
                    break
            sealed[domain.name] = total
        vacuumed: list[str] = []
        if vacuum != "none":
            async with self.db.pg() as sql:
                for table in (t for d in LEGACY for t in d.tables):
                    await maintenance.vacuum(sql, table, full=vacuum == "full")
                    vacuumed.append(table)
        return Sealing(sealed, left, vacuumed, vacuum)


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


def sealing_text(done: Sealing) -> str:
    out = [f"{name}: {done.sealed[name]} row(s) sealed, {done.left[name]} left in the clear" for name in done.sealed]
    if done.vacuumed:
        out.append(f"vacuumed ({done.vacuum}): {', '.join(done.vacuumed)}")
    if any(done.left.values()):
        out.append("NOT DONE: rows stayed locked by writers through every pass; run it again")
    return "\n".join(out)


def sealing_json(done: Sealing) -> str:
    return json.dumps(asdict(done), indent=2)
