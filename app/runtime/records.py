"""What one transition writes: artifact rows tiling the log, provenance edges, the manifests around it.

Pure functions over the stored log and the engine's outcome, so a replay (the forget issue) plans its records the
same way as the original run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from app.ids import new_id
from app.runtime.blocks import MODEL_KINDS, Block
from app.runtime.engine_calls import Outcome, StoredLog
from app.runtime.provenance import Node, Provenance, union_sources
from app.sessions.repositories.artifacts import LogEntry

Manifest = list[tuple[str, int, int]]
# Meta keys the runtime writes for itself about one run of a transition (its chunk recipe, why sampling stopped):
# a copy of an artifact, or a replayed observation, does not inherit them.
RUNTIME_META: Final = frozenset({"chunks", "finish_reason"})


@dataclass(frozen=True)
class TransitionRecords:
    artifacts: list[dict[str, Any]]  # rows for `artifacts`, in log order
    edges: list[dict[str, Any]]  # rows for `provenance_edges`
    kinds: list[str]  # the kinds this transition added
    manifest_before: Manifest
    manifest_after: Manifest
    token_count: int  # the log length after the transition

    @property
    def input_ids(self) -> list[str]:
        """The transition's inputs: observations the client sent (not results the server's tools produced)."""
        return [a["id"] for a in self.artifacts if a["kind"] not in MODEL_KINDS and not a["meta"].get("server")]

    @property
    def reply(self) -> dict[str, Any] | None:
        """The model's text output (its tool calls, also model outputs, are listed with it, not instead of it)."""
        texts = (a for a in reversed(self.artifacts) if a["kind"] in MODEL_KINDS and a["kind"] != "tool_call")
        return next(texts, None)


def chunk_recipe(at: int, sizes: Sequence[int]) -> dict[str, Any]:
    """The recipe a transition's last artifact carries (meta key "chunks"): the engine calls that built the cache
    from token `at` on, as prefill sizes, so any process rebuilds the same cache (`stored_log` reads them back)."""
    return {"at": at, "sizes": list(sizes)}


def stored_log(log: Sequence[LogEntry]) -> StoredLog:
    """The log as the database has it, with the longest contiguous chunk recipe its artifacts carry."""
    tokens = [t for entry in log for t in entry.token_ids]
    recipe: list[int] = []
    for entry in log:
        chunks = entry.chunks
        if not isinstance(chunks, dict):
            continue
        sizes = chunks.get("sizes")
        if chunks.get("at") != sum(recipe) or not isinstance(sizes, list):
            break  # a transition without a recipe (or a rewritten suffix): only the prefix before it is known
        recipe.extend(int(s) for s in sizes)
    return StoredLog(tokens, recipe if sum(recipe) <= len(tokens) else [])


def records_for(
    tenant_id: str,
    session_id: str,
    turn: int,
    log: Sequence[LogEntry],
    blocks: Sequence[Block],
    outcome: Outcome | None,
    provenance: Provenance,
    keep_ids: Sequence[str | None] = (),
) -> TransitionRecords:
    """`provenance` decides a model output's parents: the session policy's, or one made for this transition (a
    retrieval reply passes what it retrieved). `keep_ids[i]`, when given, is the id block i keeps: a
    replay re-renders observations the forget did not touch under their original ids, so a client's references to
    them survive the rewrite."""
    position = log[-1].position + 1 if log else 0
    offset = log[-1].token_end if log else 0
    prefix = [Node(e.id, e.kind, tuple(e.source_ids)) for e in log]
    added: list[Node] = []  # this transition's artifacts so far (a later model output's context includes them)
    rows: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        artifact_id = (keep_ids[index] if index < len(keep_ids) else None) or new_id("art")
        meta = dict(block.meta)
        committed = bool(meta.pop("committed", False))  # a consequential tool call whose side effect fired
        if block.kind in MODEL_KINDS:
            parents = provenance.reply_parents(prefix, added)
            sources = union_sources(parents)
            edges.extend(edge_row(session_id, p.id, artifact_id, turn) for p in parents)
            if outcome is not None and outcome.finish_reason is not None:
                meta["finish_reason"] = outcome.finish_reason
        else:
            sources = [artifact_id]  # an observation is a source: forgetting it starts from here
        if index == len(blocks) - 1 and outcome is not None and outcome.chunks is not None:
            meta["chunks"] = chunk_recipe(outcome.chunks_at, outcome.chunks)
        row = artifact_row(
            id=artifact_id, tenant_id=tenant_id, session_id=session_id, position=position, kind=block.kind, turn=turn,
            content=block.content, token_start=offset, token_ids=block.token_ids, source_ids=sources,
            committed=committed, meta=meta,
        )
        rows.append(row)
        node = Node(artifact_id, block.kind, tuple(sources))
        if block.kind in MODEL_KINDS:
            prefix, added = [*prefix, *added, node], []
        else:
            added.append(node)
        position, offset = position + 1, row["token_end"]
    before = [(e.id, e.token_start, e.token_end) for e in log]
    after = before + [(r["id"], r["token_start"], r["token_end"]) for r in rows]
    return TransitionRecords(rows, edges, [b.kind for b in blocks], before, after, offset)


def artifact_row(
    *,
    id: str,
    tenant_id: str,
    session_id: str,
    position: int,
    kind: str,
    turn: int,
    content: str,
    token_start: int,
    token_ids: Sequence[int],
    source_ids: Sequence[str],
    committed: bool,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """A row for `artifacts`: a live artifact spanning `token_ids` from `token_start` on."""
    return {
        "id": id,
        "tenant_id": tenant_id,
        "session_id": session_id,
        "position": position,
        "kind": kind,
        "turn": turn,
        "content": content,
        "token_start": token_start,
        "token_end": token_start + len(token_ids),
        "token_ids": list(token_ids),
        "source_ids": list(source_ids),
        "committed": committed,
        "archived_by": None,
        "meta": meta,
    }


def edge_row(session_id: str, parent_id: str, child_id: str, turn: int) -> dict[str, Any]:
    """A row for `provenance_edges`: `child_id`, produced at transition `turn`, depends on `parent_id`."""
    return {"session_id": session_id, "parent_id": parent_id, "child_id": child_id, "turn": turn}


def log_entries(rows: Sequence[dict[str, Any]]) -> list[LogEntry]:
    """Planned artifact rows as the log entries the next transition plans against."""
    return [
        LogEntry(
            r["id"], r["kind"], r["turn"], r["position"], r["token_start"], r["token_end"], list(r["token_ids"]),
            list(r["source_ids"]), r["meta"].get("chunks"),
        )
        for r in rows
    ]
