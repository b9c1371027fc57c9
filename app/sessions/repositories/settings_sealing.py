"""A session's settings and its tool environments at rest: sealed under leaves of their own.

- A session's system prompt and tool specs are one erasure unit: one JSON document `{"system_prompt", "tools"}` in
  `sessions.settings_sealed` under the session's settings leaf, bound to (tenant, "sessions", session id,
  "settings"). They are erased with the session (its deletion shreds that leaf), or replaced together when a forget
  rewrites the system prompt (sealed again under a fresh leaf, the old one shredded with the forget's other leaves).
- Each tool environment snapshot is a unit of its own: `env_snapshots.state_sealed` under its leaf, bound to
  (tenant, "env_snapshots", snapshot id, "state"); a replay that deletes snapshots shreds their leaves.
Leaves come from the session's stream (neighbours of its artifacts' leaves). A branch seals its copies afresh under
its own leaves: deleting one session never erases the other's settings.

Rows written before migration 0021 hold plaintext (`leaf` NULL) and read as before. Like the artifacts' helpers
(sealing.py), the process's `Sealer` is an argument; opened values are set as committed values on the ORM
objects, so a flush never writes them back in the clear.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm.attributes import set_committed_value

from app.db.legacy import LegacyJson
from app.db.models import AgentSession
from app.keys.content import Sealer
from app.keys.envelope import Binding
from app.keys.errors import Erased
from app.keys.sealed import SealedColumn

SESSIONS = "sessions"
ENVIRONMENTS = "env_snapshots"


def settings_binding(tenant_id: str, session_id: str) -> Binding:
    return Binding(tenant_id, SESSIONS, session_id, "settings")


def state_binding(tenant_id: str, snapshot_id: str) -> Binding:
    return Binding(tenant_id, ENVIRONMENTS, snapshot_id, "state")


# What `lethe keys verify` checks (app/keys/sealed.py): every session and snapshot holding a ciphertext.
SEALED_COLUMNS = (
    SealedColumn(SESSIONS, ("id",), ("settings_sealed",),
                 lambda row, _column: settings_binding(row["tenant_id"], row["id"])),
    SealedColumn(ENVIRONMENTS, ("id",), ("state_sealed",),
                 lambda row, _column: state_binding(row["tenant_id"], row["id"])),
)


async def seal_settings(
    sealer: Sealer, tenant_id: str, session_id: str, system_prompt: str | None, tools: list[Any] | None
) -> dict[str, Any]:
    """A session row's settings columns as stored: under a fresh leaf of the session's stream, only ciphertext."""
    leaf = await sealer.leaf(tenant_id, session_id)
    document = {"system_prompt": system_prompt, "tools": list(tools or [])}
    sealed = await sealer.seal_json(leaf, settings_binding(tenant_id, session_id), document)
    return {"leaf": leaf, "settings_sealed": sealed, "system_prompt": None, "tools": None}


async def open_sessions(sealer: Sealer, rows: Sequence[AgentSession]) -> None:
    """`rows` with their system prompt and tools opened in place, as committed values. A session whose settings leaf
    was shredded (a backup restored from before its deletion, or from before a forget rewrote its system prompt)
    opens with no system prompt and no tools."""
    for row in rows:
        if row.leaf is None or row.settings_sealed is None:
            if row.tools is None:  # the opened values of a row sealed meanwhile were never read: nothing to show
                set_committed_value(row, "tools", [])
            continue
        try:
            document = await sealer.open_json(settings_binding(row.tenant_id, row.id), row.settings_sealed)
        except Erased:
            document = {"system_prompt": None, "tools": []}
        set_committed_value(row, "system_prompt", document.get("system_prompt"))
        set_committed_value(row, "tools", list(document.get("tools") or []))


async def seal_state(
    sealer: Sealer, tenant_id: str, session_id: str, snapshot_id: str, state: dict[str, Any]
) -> dict[str, Any]:
    """A snapshot's state columns as stored: under a fresh leaf of the session's stream, only ciphertext."""
    leaf = await sealer.leaf(tenant_id, session_id)
    sealed = await sealer.seal_json(leaf, state_binding(tenant_id, snapshot_id), state)
    return {"tenant_id": tenant_id, "leaf": leaf, "state_sealed": sealed, "state": None}


async def open_state(
    sealer: Sealer, tenant_id: str | None, snapshot_id: str, plain: dict[str, Any] | None, sealed: bytes | None
) -> dict[str, Any] | None:
    """A snapshot's state (a copy: callers mutate it); None when its leaf was shredded."""
    if sealed is None or tenant_id is None:
        return copy.deepcopy(plain)
    try:
        state: dict[str, Any] = await sealer.open_json(state_binding(tenant_id, snapshot_id), sealed)
    except Erased:
        return None
    return state


async def seal_environment_rows(sealer: Sealer, tenant_id: str, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Snapshot rows (opened: `state` in the clear) as a new session stores them: each under a fresh leaf."""
    out = []
    for row in rows:
        sealed = await seal_state(sealer, tenant_id, row["session_id"], row["id"], row["state"])
        out.append({**row, **sealed})
    return out


# Rows from before migration 0021, for `lethe keys seal` (app/db/legacy.py): settings and environments in the clear.
LEGACY = (
    LegacyJson(SESSIONS, ("system_prompt", "tools"), "settings_sealed",
               document=lambda row: {"system_prompt": row["system_prompt"], "tools": list(row["tools"] or [])},
               binding=lambda tenant_id, row: settings_binding(tenant_id, row["id"]),
               stream=lambda row: row["id"], session="t.id"),
    LegacyJson(ENVIRONMENTS, ("state",), "state_sealed", document=lambda row: row["state"],
               binding=lambda tenant_id, row: state_binding(tenant_id, row["id"]),
               stream=lambda row: row["session_id"], source="JOIN sessions s ON s.id = t.session_id",
               tenant="s.tenant_id", sets_tenant=True),
)
