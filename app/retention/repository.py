"""Retention's SQL: the policies, the sweep's lease, and the keyset pages of what expired.

An expired session: idle (no turn, forget or change: `sessions.updated_at`) for longer than its subject's
`sessions_max_idle_days`, else the tenant's. An expired memory key: live and last written longer ago than its
namespace's own `memory_max_age_days` (`retention_namespaces`), else that of a subject its namespace is linked to (the
shortest, if several), else the tenant's. A NULL limit keeps forever (an override's NULL defers to the next). `:now`
is the sweep's clock (a test moves it; production passes the time).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.db.statements import Sql, Statement

DEFAULT = ""  # the subject_id of the tenant's own policy row

_PUT = Statement("""
    INSERT INTO retention_policies (tenant_id, subject_id, sessions_max_idle_days, memory_max_age_days)
    VALUES (:tenant_id, :subject_id, :sessions_days, :memory_days)
    ON CONFLICT (tenant_id, subject_id) DO UPDATE
       SET sessions_max_idle_days = EXCLUDED.sessions_max_idle_days,
           memory_max_age_days = EXCLUDED.memory_max_age_days, updated_at = now()
""")
_PUT_NAMESPACE = Statement("""
    INSERT INTO retention_namespaces (tenant_id, namespace, memory_max_age_days)
    VALUES (:tenant_id, :namespace, :memory_days)
    ON CONFLICT (tenant_id, namespace) DO UPDATE
       SET memory_max_age_days = EXCLUDED.memory_max_age_days, updated_at = now()
""")
_DUE_NOW = Statement("""
    INSERT INTO retention_sweeps (tenant_id, next_at) VALUES (:tenant_id, now())
    ON CONFLICT (tenant_id) DO UPDATE SET next_at = now()
""")
_POLICIES = Statement("""
    SELECT subject_id, sessions_max_idle_days, memory_max_age_days, updated_at FROM retention_policies
    WHERE tenant_id = :tenant_id ORDER BY subject_id LIMIT :limit
""")
_NAMESPACES = Statement("""
    SELECT namespace, memory_max_age_days, updated_at FROM retention_namespaces
    WHERE tenant_id = :tenant_id ORDER BY namespace LIMIT :limit
""")
_SWEEP = Statement("SELECT next_at, last_forget_id FROM retention_sweeps WHERE tenant_id = :tenant_id")
_CLAIM = Statement("""
    UPDATE retention_sweeps SET lease_owner = :owner, lease_expires_at = now() + make_interval(secs => :lease_s)
    WHERE tenant_id = (
        SELECT tenant_id FROM retention_sweeps
        WHERE next_at <= :now AND (lease_owner IS NULL OR lease_expires_at < now())
        ORDER BY next_at LIMIT 1 FOR UPDATE SKIP LOCKED
    )
    RETURNING tenant_id
""")
_DONE = Statement("""
    UPDATE retention_sweeps
       SET lease_owner = NULL, lease_expires_at = NULL, next_at = :next_at,
           last_forget_id = coalesce(:forget_id, last_forget_id)
     WHERE tenant_id = :tenant_id AND lease_owner = :owner
""")
_EXPIRED_SESSIONS = Statement("""
    SELECT s.id FROM sessions s
      LEFT JOIN retention_policies o ON o.tenant_id = s.tenant_id AND o.subject_id = s.subject_id
      LEFT JOIN retention_policies d ON d.tenant_id = s.tenant_id AND d.subject_id = ''
     WHERE s.tenant_id = :tenant_id AND s.id > :after
       AND s.updated_at < CAST(:now AS timestamptz)
                          - make_interval(days => coalesce(o.sessions_max_idle_days, d.sessions_max_idle_days))
     ORDER BY s.id LIMIT :limit
""")
_EXPIRED_KEYS = Statement("""
    SELECT r.namespace, r.key FROM memory_records r
      LEFT JOIN retention_policies d ON d.tenant_id = r.tenant_id AND d.subject_id = ''
      LEFT JOIN retention_namespaces n ON n.tenant_id = r.tenant_id AND n.namespace = r.namespace
      LEFT JOIN LATERAL (
          SELECT min(p.memory_max_age_days) AS days FROM subjects j
            JOIN retention_policies p ON p.tenant_id = j.tenant_id AND p.subject_id = j.id
           WHERE j.tenant_id = r.tenant_id AND j.memory_namespaces @> ARRAY[r.namespace]
      ) o ON true
     WHERE r.tenant_id = :tenant_id AND NOT r.forgotten AND (r.namespace, r.key) > (:after_ns, :after_key)
       AND r.updated_at < CAST(:now AS timestamptz)
                          - make_interval(days => coalesce(n.memory_max_age_days, o.days, d.memory_max_age_days))
     ORDER BY r.namespace, r.key LIMIT :limit
""")


@dataclass(frozen=True)
class Policy:
    subject_id: str  # '' for the tenant's own
    sessions_max_idle_days: int | None
    memory_max_age_days: int | None
    updated_at: datetime


async def put(sql: Sql, tenant_id: str, subject_id: str, sessions_days: int | None, memory_days: int | None) -> None:
    """Set a policy, and make the tenant's sweep due now (a shorter limit takes effect at once)."""
    await sql.rowcount(_PUT, {"tenant_id": tenant_id, "subject_id": subject_id, "sessions_days": sessions_days,
                              "memory_days": memory_days})
    await sql.rowcount(_DUE_NOW, {"tenant_id": tenant_id})


@dataclass(frozen=True)
class NamespacePolicy:
    namespace: str
    memory_max_age_days: int | None
    updated_at: datetime


async def put_namespace(sql: Sql, tenant_id: str, namespace: str, memory_days: int | None) -> None:
    """Set a namespace's own limit, and make the tenant's sweep due now."""
    await sql.rowcount(_PUT_NAMESPACE, {"tenant_id": tenant_id, "namespace": namespace, "memory_days": memory_days})
    await sql.rowcount(_DUE_NOW, {"tenant_id": tenant_id})


async def namespace_policies(sql: Sql, tenant_id: str, limit: int) -> list[NamespacePolicy]:
    rows = await sql.all(_NAMESPACES, {"tenant_id": tenant_id, "limit": limit})
    return [NamespacePolicy(r["namespace"], r["memory_max_age_days"], r["updated_at"]) for r in rows]


async def policies(sql: Sql, tenant_id: str, limit: int) -> list[Policy]:
    rows = await sql.all(_POLICIES, {"tenant_id": tenant_id, "limit": limit})
    return [Policy(r["subject_id"], r["sessions_max_idle_days"], r["memory_max_age_days"], r["updated_at"])
            for r in rows]


async def sweep_state(sql: Sql, tenant_id: str) -> tuple[datetime | None, str | None]:
    """(when the next sweep is due, the last sweep's receipt) — (None, None) before any policy."""
    row = await sql.one(_SWEEP, {"tenant_id": tenant_id})
    return (None, None) if row is None else (row["next_at"], row["last_forget_id"])


async def claim(sql: Sql, owner: str, now: datetime, lease_s: float) -> str | None:
    """Lease one tenant whose sweep is due; its id (None: nothing due, or all leased elsewhere)."""
    row = await sql.one(_CLAIM, {"owner": owner, "now": now, "lease_s": float(lease_s)})
    return None if row is None else str(row["tenant_id"])


async def done(sql: Sql, tenant_id: str, owner: str, next_at: datetime, forget_id: str | None) -> None:
    await sql.rowcount(_DONE, {"tenant_id": tenant_id, "owner": owner, "next_at": next_at, "forget_id": forget_id})


async def expired_sessions(sql: Sql, tenant_id: str, now: datetime, after: str, limit: int) -> list[str]:
    rows = await sql.all(_EXPIRED_SESSIONS, {"tenant_id": tenant_id, "now": now, "after": after, "limit": limit})
    return [r["id"] for r in rows]


async def expired_keys(
    sql: Sql, tenant_id: str, now: datetime, after: tuple[str, str], limit: int
) -> list[tuple[str, str]]:
    rows = await sql.all(_EXPIRED_KEYS, {"tenant_id": tenant_id, "now": now, "after_ns": after[0],
                                         "after_key": after[1], "limit": limit})
    return [(r["namespace"], r["key"]) for r in rows]
