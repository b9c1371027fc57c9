"""Forget targets, where they sit in a session and their closure there (Algorithm 1, lines 1-3).

A target names what to forget in one of six forms (API.md): an artifact, a set of artifacts (DeLLM's M by id; what a
plan made from a request in plain words stores), a text span in a session's observations, a memory record (every
injection of it), a keyword (PostgreSQL full-text search) or a semantic query over a session's observations.
Locating it in a session yields the *sources* (the artifacts where it entered), what each source becomes once
sanitized, and τ, the first transition any of them belongs to.

Sanitizing follows the counterfactual exactly: an artifact target drops the observation; a text target removes every
occurrence of the text from the observations holding it and changes nothing else; an observation left empty (only
whitespace) is dropped. Model outputs are never edited here: they are derived, and the strategy decides their fate.

A semantic query is embedded before anything locks the session (`embed_query`, which also embeds the session's
observations that have no vector yet, in its own short transaction): under the session's lease only the SQL
similarity query runs, so no turn waits on the embedder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.db.models import AgentSession, Artifact
from app.embeddings import Embedder
from app.forget.closure import ClosureEntry, closure_of
from app.forget.repositories.sealing import clear_target
from app.keys.content import Sealer
from app.runtime.blocks import MODEL_KINDS, ROLE_OF
from app.runtime.retrieval import embed_rows
from app.sessions.repositories import artifact_search as search_repo
from app.sessions.repositories import artifacts as artifacts_repo

DEFAULT_MIN_SIMILARITY: Final = 0.5


@dataclass(frozen=True)
class Target:
    artifact_id: str | None = None
    session_id: str | None = None
    text: str | None = None
    namespace: str | None = None
    key: str | None = None
    query: str | None = None
    min_similarity: float | None = None
    keyword: str | None = None
    artifact_ids: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Target:
        memory = data.get("memory") or {}
        return cls(
            artifact_id=data.get("artifact_id"),
            session_id=data.get("session_id"),
            text=data.get("text"),
            namespace=memory.get("namespace"),
            key=memory.get("key"),
            query=data.get("query"),
            min_similarity=data.get("min_similarity"),
            keyword=data.get("keyword"),
            artifact_ids=tuple(data["artifact_ids"]) if data.get("artifact_ids") is not None else None,
        )

    @property
    def kind(self) -> str:
        if self.artifact_id is not None:
            return "artifact"
        if self.text is not None:
            return "text"
        if self.namespace is not None:
            return "memory"
        if self.keyword is not None:
            return "keyword"
        if self.artifact_ids is not None:
            return "artifacts"
        return "query"

    @property
    def searches(self) -> bool:
        """Matched by a search the caller runs (pgvector or full-text), not by ids or text."""
        return self.query is not None or self.keyword is not None

    def to_dict(self) -> dict[str, Any]:
        """The target as stored while the job runs (it must survive a crash, text included)."""
        out: dict[str, Any] = {}
        if self.artifact_id is not None:
            out["artifact_id"] = self.artifact_id
        if self.session_id is not None:
            out["session_id"] = self.session_id
        if self.text is not None:
            out["text"] = self.text
        if self.namespace is not None:
            out["memory"] = {"namespace": self.namespace, "key": self.key}
        if self.query is not None:
            out["query"] = self.query
            out["min_similarity"] = self.min_similarity
        if self.keyword is not None:
            out["keyword"] = self.keyword
        if self.artifact_ids is not None:
            out["artifact_ids"] = list(self.artifact_ids)
        return out

    def scrubbed(self) -> dict[str, Any]:
        """The target as a finished job keeps it (and a sealed job's clear column holds): the forgotten words replaced
        by their length (app/forget/repositories/sealing.py)."""
        return clear_target(self.to_dict())


@dataclass(frozen=True)
class Located:
    """The target in one session."""

    tau: int  # the first transition holding a source
    sources: list[str]  # artifact ids where the target entered
    edits: dict[str, str | None] = field(default_factory=dict)  # observation id → sanitized content (None: dropped)
    span: str | None = None  # the text a string-redaction baseline strips from every artifact


def locate_in(target: Target, rows: Sequence[Artifact], matches: Sequence[str] = ()) -> Located | None:
    """Where `target` entered the session whose artifacts are `rows` (log order); None when it is not there.

    `matches` are the ids a semantic query or a keyword selected (the caller runs the search)."""
    if target.artifact_id is not None:
        row = next((r for r in rows if r.id == target.artifact_id), None)
        if row is None:
            return None
        original = (row.meta or {}).get("copy_of")
        if original is not None:  # a compaction's copy: forgetting it is forgetting what it copies
            row = next((r for r in rows if r.id == original), row)
        edits: dict[str, str | None] = {} if row.kind in MODEL_KINDS else {row.id: None}
        return Located(row.turn, [row.id], edits, row.content)
    if target.text is not None:
        return _locate_text(target.text, rows)
    if target.namespace is not None:
        hits = [r for r in rows if r.kind == "memory" and _is_record(r, target.namespace, target.key)]
        return _dropping(hits)
    if target.artifact_ids is not None:
        return _ids(set(target.artifact_ids), rows)
    wanted = set(matches)
    return _dropping([r for r in rows if r.id in wanted and r.kind not in MODEL_KINDS])


def _ids(wanted: set[str], rows: Sequence[Artifact]) -> Located | None:
    """A set of artifacts: observations dropped, model outputs named as sources (their dependents go with them)."""
    hits = [r for r in rows if r.id in wanted and r.archived_by is None]
    if not hits:
        return None
    edits: dict[str, str | None] = {r.id: None for r in hits if r.kind not in MODEL_KINDS}
    return Located(min(r.turn for r in hits), [r.id for r in hits], edits)


def _locate_text(text: str, rows: Sequence[Artifact]) -> Located | None:
    edits: dict[str, str | None] = {}
    first: int | None = None
    for row in rows:
        if row.kind in MODEL_KINDS or text not in row.content:
            continue
        cleaned = row.content.replace(text, "")
        edits[row.id] = cleaned if cleaned.strip() else None
        first = row.turn if first is None else min(first, row.turn)
    if first is not None:
        return Located(first, list(edits), edits, text)
    # Only model outputs hold it: nothing external to sanitize; the strategy decides (replay refuses).
    outputs = [r for r in rows if text in r.content]
    if not outputs:
        return None
    return Located(min(r.turn for r in outputs), [r.id for r in outputs], {}, text)


def _dropping(hits: Sequence[Artifact]) -> Located | None:
    if not hits:
        return None
    return Located(min(r.turn for r in hits), [r.id for r in hits], {r.id: None for r in hits})


def _is_record(row: Artifact, namespace: str | None, key: str | None) -> bool:
    meta = row.meta or {}
    return bool(meta.get("namespace") == namespace and meta.get("key") == key)


def only_model_outputs(located: Located) -> bool:
    """True when the target sits only in model outputs: no observation to sanitize, so a replay would regenerate
    the same outputs from the same inputs."""
    return not located.edits


@dataclass(frozen=True)
class Found:
    """The target in one session: the session's artifacts (archived ones too: a replay needs them), where the
    target sits and its closure."""

    rows: list[Artifact]
    located: Located
    closure: list[ClosureEntry]

    @property
    def live_rows(self) -> list[Artifact]:
        return [r for r in self.rows if r.archived_by is None]


async def embed_query(
    db: Database, sealer: Sealer, embedder: Embedder, session_id: str, query: str, *, outputs: bool = False
) -> list[float]:
    """The query's vector, once every observation of the session (model outputs too with `outputs`) has one: run
    before the session is locked, so the lock is never held while the embedder works."""
    excluded = _excluded(outputs)
    [vector] = await embed_rows(
        db, sealer, embedder, lambda tx: search_repo.unembedded_observations(tx, sealer, session_id, excluded), query
    )
    return vector


async def embed_observations(
    db: Database, sealer: Sealer, embedder: Embedder, session_id: str, *, outputs: bool = False
) -> None:
    """Embed every observation of the session (model outputs too with `outputs`) that has no vector yet, so `similar`
    sees all of them: for a caller that embedded its query once for many sessions (a subject's `also.query`)."""
    excluded = _excluded(outputs)
    await embed_rows(
        db, sealer, embedder, lambda tx: search_repo.unembedded_observations(tx, sealer, session_id, excluded)
    )


async def similar(
    tx: AsyncSession, sealer: Sealer, session_id: str, vector: list[float], min_similarity: float | None, *,
    outputs: bool = False,
) -> list[str]:
    """pgvector similarity over the session's observations (model outputs too with `outputs`) to an embedded query."""
    threshold = DEFAULT_MIN_SIMILARITY if min_similarity is None else min_similarity
    return await search_repo.similar_observations(tx, sealer, session_id, vector, threshold, _excluded(outputs))


async def unembedded(tx: AsyncSession, sealer: Sealer, session_id: str, *, outputs: bool = False) -> bool:
    """Whether an observation arrived, since the query was embedded, that a similarity query cannot see yet."""
    return bool(await search_repo.unembedded_observations(tx, sealer, session_id, _excluded(outputs)))


async def find(
    tx: AsyncSession, sealer: Sealer, session: AgentSession, target: Target, query_vector: list[float] | None = None
) -> Found | None:
    """Where `target` sits in `session` and its closure; None when it is not there. A query target needs its
    `query_vector` (embed_query)."""
    matches: list[str] = []
    if target.query is not None:
        assert query_vector is not None, "a query target is embedded before the session is read"
        matches = await similar(tx, sealer, session.id, query_vector, target.min_similarity)
    elif target.keyword is not None:
        kinds = [k for k in ROLE_OF if k not in ("system", "instruction")]
        matches = await search_repo.keyword_matches(tx, sealer, session.id, target.keyword, kinds)
    rows = await artifacts_repo.list_all(tx, sealer, session.tenant_id, session.id)
    located = locate_in(target, rows, matches)
    if located is None:
        return None
    edges = await artifacts_repo.edges_from_turn(tx, session.id, located.tau)
    return Found(rows, located, closure_of(located.sources, edges, rows))


def _excluded(outputs: bool) -> list[str]:
    return [] if outputs else sorted(MODEL_KINDS)
