"""Branching: a new session holding a session's first transitions, token for token, and nothing shared afterwards.

What it is for: OpenAI's `previous_response_id` naming a response that is no longer its session's newest transition
(and a resent history that stops before the session's end) continues *from that response*: the conversation as it
stood there, without what came later. Lethe answers it in a branch, so the original session stays as it is.

The copy is made under the source session's lease, so no turn or forget moves it meanwhile: every row transitions
≤ t wrote (artifacts, archived ones too, since a forget may replay through a compaction; provenance edges;
checkpoints; snapshots of the built-in tool environment; the ledger of consequential calls that fired) under new
ids, with every id a row holds remapped (sources, parents, a compaction copy's `copy_of`), and the session's
configuration (per-transition sampling through t only). A checkpoint is copied only if its manifest still matched
the source's log, and its manifest is recomputed over the new ids, so a forget in the branch restores exactly what
one in the source would. The branch has its own epoch, cache salt and forget history from then on: deleting an item
in one branch forgets it there only.

Cheap through the cache: the copy has the source's tokens in the source's chunks (the chunk recipe is in the
artifacts' meta), so the source's cached prefix is the branch's. This process's cache handle of the source, if it
has one, is forked (on the hf engine the twin shares the tensors) and cropped to the branch point; the branch's
first transition then prefills only its own tokens. On the vLLM engines the branch has a cache salt of its own
(app/runtime/salts.py: sessions never share prefix blocks, so a forget in one cannot be probed from another), and
its first transition prefills the copied prefix once.
"""

from __future__ import annotations

from typing import Any

from app.ids import new_id
from app.runtime.checkpoints import manifest_sha256
from app.runtime.routing import session_route
from app.sessions.repositories import branching as repo
from app.sessions.repositories.branching import Row, Transitions
from app.sessions.service import SessionService
from app.sessions.views import StaleHead

_SESSION_COPIED = ("tenant_id", "system_prompt", "memory_namespace", "subject_id", "context_policy",
                   "checkpoint_policy", "retrieval", "tools", "compaction")


class Branching:
    def __init__(self, sessions: SessionService) -> None:
        self.sessions = sessions

    async def branch(self, tenant_id: str, source_id: str, through_turn: int, *, epoch: int | None = None) -> str:
        """A new session holding `source_id`'s transitions 0..`through_turn`; its id. `epoch`, when given, is the
        source's epoch the caller planned against: a forget since then answers 409 (the history it saw is gone)."""
        async with self.sessions.leased(tenant_id, source_id, "running", self.sessions.locks.timeout_s) as lease:
            source = lease.row
            if epoch is not None and source.epoch != epoch:
                raise StaleHead(f"session {source_id!r} was rewritten by a forget since this request was planned")
            if not 0 <= through_turn <= source.turns:
                raise StaleHead(f"session {source_id!r} has no transition {through_turn}")
            async with lease.reads() as tx:
                rows = await repo.transitions_through(tx, self.sessions.sealer, source_id, through_turn)
            branch_id = new_id("ses")
            session, copied = _copy({c: getattr(source, c) for c in _SESSION_COPIED}, dict(source.sampling),
                                    list(source.flagged_sources or []), rows, through_turn, branch_id)
            async with self.sessions.db.transaction() as tx:
                await repo.insert_session(tx, self.sessions.sealer, session, copied)
            prefix = [t for a in _live_at(copied.artifacts, through_turn) for t in a["token_ids"]]
            await self._fork_cache(tenant_id, source_id, branch_id, prefix)
        return branch_id

    async def _fork_cache(self, tenant_id: str, source_id: str, branch_id: str, prefix: list[int]) -> None:
        """The source's cached prefix for the branch (see the module docstring). Only a handle that holds exactly
        that prefix is forked; without one the branch's first transition prefills it: a miss costs work, never
        correctness (the first transition syncs whatever handle it finds with the stored log)."""
        handle = await self.sessions.handles.checkout(session_route(tenant_id, source_id))
        slot = self.sessions.slot
        if handle is None or not slot.ready or handle.tokens[: len(prefix)] != prefix:
            return
        engine = slot.engine
        twin = await engine.fork(handle, session_route(tenant_id, branch_id))
        if len(twin.tokens) > len(prefix):
            await engine.crop(twin, len(prefix))
        self.sessions.handles.keep(session_route(tenant_id, branch_id), twin)


def _live_at(artifacts: list[Row], turn: int) -> list[Row]:
    """The live prompt at the end of transition `turn` (compactions up to it applied)."""
    return [a for a in artifacts if a["turn"] <= turn and (a["archived_by"] is None or a["archived_by"] > turn)]


def _manifest(rows: list[Row], ids: dict[str, str] | None = None) -> str:
    names = ids or {}
    return manifest_sha256((str(names.get(r["id"], r["id"])), int(r["token_start"]), int(r["token_end"])) for r in rows)


def _copy(
    config: dict[str, Any], sampling: dict[str, Any], flagged: list[str], rows: Transitions, turn: int, branch_id: str
) -> tuple[Row, Transitions]:
    """The branch's session row and its rows, every id remapped (pure: tested without a database)."""
    ids = {a["id"]: new_id("art") for a in rows.artifacts}

    def art(a: Row) -> Row:
        meta = dict(a["meta"] or {})
        if meta.get("copy_of") in ids:
            meta["copy_of"] = ids[meta["copy_of"]]
        archived = a["archived_by"] if a["archived_by"] is not None and a["archived_by"] <= turn else None
        out = {k: v for k, v in a.items() if k != "created_at"}
        out.update(id=ids[a["id"]], session_id=branch_id, meta=meta, archived_by=archived,
                   source_ids=[ids.get(s, s) for s in a["source_ids"]])
        return out

    envs = {e["id"]: new_id("env") for e in rows.environments}
    checkpoints = []
    for c in rows.checkpoints:
        live = _live_at(rows.artifacts, c["turn"])
        if _manifest(live) != c["manifest_sha256"]:
            continue  # its prefix was rewritten since (a forget): no forget may restore it, here or there
        checkpoints.append({**{k: v for k, v in c.items() if k != "created_at"}, "id": new_id("ckp"),
                            "session_id": branch_id, "env_snapshot_id": envs.get(c["env_snapshot_id"]),
                            "manifest_sha256": _manifest(live, ids)})
    calls = {str((a["meta"] or {}).get("tool_call_id")) for a in rows.artifacts if a["kind"] == "tool_call"}
    live = _live_at(rows.artifacts, turn)
    per_turn = {k: v for k, v in (sampling.get("per_turn") or {}).items() if int(k) <= turn}
    session = {
        **config, "id": branch_id, "epoch": 0, "cache_generation": 0, "status": "idle", "turns": turn,
        "token_count": live[-1]["token_end"] if live else 0,
        "sampling": {**{k: v for k, v in sampling.items() if k != "per_turn"}, **({"per_turn": per_turn}
                                                                                 if per_turn else {})},
        "flagged_sources": [ids[s] for s in flagged if s in ids],
    }
    copied = Transitions(
        artifacts=[art(a) for a in rows.artifacts],
        edges=[{**e, "session_id": branch_id, "parent_id": ids[e["parent_id"]], "child_id": ids[e["child_id"]]}
               for e in rows.edges if e["parent_id"] in ids and e["child_id"] in ids],
        checkpoints=checkpoints,
        environments=[{**{k: v for k, v in e.items() if k != "created_at"}, "id": envs[e["id"]],
                       "session_id": branch_id} for e in rows.environments],
        fired=[{**f, "session_id": branch_id} for f in rows.fired if f["call_id"] in calls],
    )
    return session, copied
