"""Forgetting in a retrieval session (DeLLM): remove M, and regenerate or delete what was derived from it.

M is the located target (observations dropped or sanitized, or model outputs named directly) and Dep(M) its closure
over the exact provenance edges. Walking the store in log order, every model output is kept, deleted, or regenerated
(a new output with a new id, in the same transition and place, produced by the runtime's one transition function,
runtime/transition.py, over the store as it now stands: without M, with the outputs regenerated before it):

- `delete` (the paper's deletion, `delete_dependents`): M and Dep(M) are deleted. Summaries are derived messages, not
  replies: a summary in Dep(M) is regenerated from its remaining sources (deleted when none remain).
- `selective` (`selective_replay`): every output in Dep(M) \\ M is regenerated, retrieval re-run (it may pick other
  messages now). An output outside Dep(M) is kept as it is unless its retrieval, re-run over the changed store, now
  picks a different set of messages (a regenerated reply may rank where an old one did not); then it is regenerated
  too. The re-check costs a query, not a model call, and makes the result the session that never saw M: an output
  whose retrieved set is unchanged has the same prompt and the same seed, hence the same tokens.
- `full` (`full_reset`): every output is regenerated: the reference the selective mode must equal.

A reply whose own turn held nothing but M is deleted (no question is left to answer), like the empty transition a
full session's forget leaves. The result is a `Rewritten` change (deletions, in-place updates with spans re-tiled and
sanitized observations re-embedded, inserted rows with their edges and embeddings) swapped in by the service in one
commit (executor.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.db.models import Artifact
from app.forget.receipts import replay_mode
from app.forget.replay import observation_of
from app.forget.rewrite import Rewritten
from app.forget.session_work import SessionWork
from app.runtime import retrieval
from app.runtime.blocks import MODEL_KINDS, Block, render, sampled_of
from app.runtime.records import artifact_row, edge_row
from app.runtime.transition import Compaction, RetrievalView, SessionState, TransitionInput, step
from app.sessions.repositories.artifact_search import Neighbor
from app.sessions.repositories.artifacts import LogEntry

Mode = Literal["delete", "selective", "full"]


@dataclass
class _Final:
    """A row of the store as it will be."""

    id: str
    kind: str
    turn: int
    position: int
    content: str
    token_ids: list[int]
    source_ids: list[str]
    meta: dict[str, Any]
    original: Artifact | None  # the stored row it keeps or updates (None: inserted)
    vector: list[float] | None = None  # a new embedding (inserted or sanitized rows)
    parents: list[str] = field(default_factory=list)  # inserted rows' provenance

    @classmethod
    def kept(cls, row: Artifact) -> _Final:
        return cls(
            row.id, row.kind, row.turn, row.position, row.content, list(row.token_ids), list(row.source_ids),
            dict(row.meta or {}), row,
        )

    def neighbor(self) -> Neighbor:
        return Neighbor(self.id, self.kind, self.turn, self.position, self.content, self.source_ids, 0.0)


async def regenerate(work: SessionWork, mode: Mode) -> Rewritten:
    return await _Regeneration(work, mode).run()


class _Regeneration:
    def __init__(self, work: SessionWork, mode: Mode) -> None:
        self.work, self.mode = work, mode
        session = work.session
        self.edits = work.located.edits
        self.sources = set(work.located.sources)
        self.closure = {entry.artifact_id for entry in work.closure}
        self.params = retrieval.Params.of(session.retrieval)
        self.out = Rewritten(system_prompt=session.system_prompt)
        self.finals: list[_Final] = []
        self.by_id: dict[str, _Final] = {}  # a stored id → what it became (a regenerated output: its new row)
        self.fresh: list[retrieval.Fresh] = []  # new versions retrieval must see
        self.changed: set[str] = set()  # stored versions retrieval must not see: deleted, sanitized, regenerated

    async def run(self) -> Rewritten:
        for row in self.work.live_rows:
            if row.kind not in MODEL_KINDS:
                await self._observation(row)
            elif row.id in self.sources or (row.id in self.closure and not self._regenerates(row)):
                self._gone(row)  # M itself, or a dependent this mode deletes
            elif row.id in self.closure or self.mode == "full" or await self._context_changed(row):
                await self._remake(row)
            else:
                self._keep(_Final.kept(row))
        self._retile()
        return self.out

    def _regenerates(self, row: Artifact) -> bool:
        return self.mode != "delete" or row.kind == "summary"

    async def _observation(self, row: Artifact) -> None:
        if row.id in self.edits and self.edits[row.id] is None:
            self._gone(row)
            return
        final = _Final.kept(row)
        if row.id in self.edits:  # sanitized: new text, new tokens, new embedding
            content = self.edits[row.id] or ""
            final.content = content
            final.token_ids = render(self.work.m.engine.chat, observation_of(row, content)).token_ids
            final.vector = (await self.work.m.embedder.embed([content]))[0]
            self._replaced(row, final)
        self._keep(final)

    def _keep(self, final: _Final) -> None:
        self.finals.append(final)
        self.by_id[final.original.id if final.original is not None else final.id] = final

    def _gone(self, row: Artifact) -> None:
        self.out.deleted.append(row.id)
        self.changed.add(row.id)
        self._touched(row.turn)
        if row.kind == "system":
            self.out.system_prompt = None

    def _replaced(self, row: Artifact, final: _Final) -> None:
        self.changed.add(row.id)
        self.fresh.append(retrieval.Fresh(final.neighbor(), final.vector or []))
        self._touched(row.turn)

    def _touched(self, turn: int) -> None:
        self.out.first_turn = turn if self.out.first_turn is None else min(self.out.first_turn, turn)

    def _own(self, turn: int) -> list[_Final]:
        """The observations of transition `turn` as they now stand: what its reply answers."""
        return [f for f in self.finals if f.turn == turn and f.kind not in MODEL_KINDS]

    async def _context_changed(self, row: Artifact) -> bool:
        """Would this output (outside Dep(M)) see another context in the store as it now stands?"""
        if not self.changed:
            return False
        meta = row.meta or {}
        if row.kind == "summary":
            return any(i in self.changed for i in meta.get("summarized", []))
        own = self._own(row.turn)
        if not own:
            return True
        before = {str(m["id"]) for m in meta.get("retrieved", [])}
        now = await self._retrieve(row.turn, own)
        return before != {m.id for m in now}

    async def _retrieve(self, turn: int, own: Sequence[_Final]) -> list[Neighbor]:
        query = await self._query_vector(own)
        async with self.work.m.db.transaction() as tx:
            return await retrieval.retrieve(
                tx, self.work.m.sealer, self.work.session.id, query, self.params, turn, exclude=sorted(self.changed),
                fresh=self.fresh,
            )

    async def _query_vector(self, own: Sequence[_Final]) -> list[float]:
        """What the turn's retrieval searched with, by the runtime's one rule (`retrieval.query_vector`), given the
        vectors the store already holds (its stored one, or the new one of a sanitized message): re-checking every
        reply after a change must not embed again what the store already holds."""
        blocks = [Block(f.kind, f.content, f.token_ids) for f in own]
        known = [self._known_vector(own[0])] if len(own) == 1 else []
        return await retrieval.query_vector(self.work.m.embedder, blocks, known)

    async def _remake(self, row: Artifact) -> None:
        """Regenerate output `row` over the store as it now stands (deleted when nothing is left to derive it from):
        transition `row.turn` run again by the runtime's transition function, on the store as it will be."""
        work = self.work
        if row.kind == "summary":
            summarized = [self.by_id[i] for i in (row.meta or {}).get("summarized", []) if i in self.by_id]
            if not summarized:
                self._gone(row)
                return
            sources = [f.neighbor() for f in summarized]
            draft = work.m.engine.chat.encode(row.content) if work.m.replay_verify else None
            t = TransitionInput(row.turn, compaction=Compaction(0, (), sources=sources), draft=draft)
        else:
            own = self._own(row.turn)
            if not own:
                self._gone(row)
                return
            t = TransitionInput(
                row.turn, [Block(f.kind, f.content, f.token_ids) for f in own], keep_ids=[f.id for f in own],
                vectors=[self._known_vector(f) for f in own],
                view=RetrievalView(exclude=sorted(self.changed), fresh=list(self.fresh)),
                draft=sampled_of(work.m.engine.chat, list(row.token_ids)) if work.m.replay_verify else None,
            )
        done = await step(work.m, work.session, work.policy, SessionState(self._log(), 0), t)
        output = done.records.artifacts[0] if row.kind == "summary" else done.reply
        assert output is not None
        made = _Final(
            id=output["id"], kind=row.kind, turn=row.turn, position=row.position, content=output["content"],
            token_ids=list(output["token_ids"]), source_ids=list(output["source_ids"]), meta=dict(output["meta"]),
            original=None, vector=done.embeddings.get(output["id"]),
            parents=[e["parent_id"] for e in done.records.edges if e["child_id"] == output["id"]],
        )
        self.out.deleted.append(row.id)
        self._replaced(row, made)
        self.finals.append(made)
        self.by_id[row.id] = made
        self.out.transitions += 1
        self.out.prefilled += done.usage.prefill_tokens
        self.out.reused += done.usage.reused_tokens
        self.out.decoded += done.usage.decode_tokens
        self.out.verified += done.usage.verified_tokens
        self.out.modes[str(row.turn)] = replay_mode(done.usage.verified_tokens, done.usage.decode_tokens)

    def _known_vector(self, final: _Final) -> list[float] | None:
        if final.vector is not None:
            return final.vector
        stored = None if final.original is None else final.original.embedding
        return None if stored is None else [float(x) for x in stored]

    def _log(self) -> list[LogEntry]:
        """The store as it now stands, up to the output being regenerated, as the transition's log."""
        return [
            LogEntry(f.id, f.kind, f.turn, f.position, 0, len(f.token_ids), f.token_ids, f.source_ids, None)
            for f in self.finals
        ]

    def _retile(self) -> None:
        """Spans from token 0 over the store as it will be: the rows to update and to insert, and the new edges."""
        session = self.work.session
        offset = 0
        for final in self.finals:
            start, end = offset, offset + len(final.token_ids)
            offset = end
            original = final.original
            if original is None:
                row = artifact_row(
                    id=final.id, tenant_id=session.tenant_id, session_id=session.id, position=final.position,
                    kind=final.kind, turn=final.turn, content=final.content, token_start=start,
                    token_ids=final.token_ids, source_ids=final.source_ids, committed=False, meta=final.meta,
                )
                self.out.inserted.append({**row, "embedding": final.vector})
                self.out.edges.extend(edge_row(session.id, p, final.id, final.turn) for p in final.parents)
            elif final.content != original.content or start != original.token_start:
                update: dict[str, Any] = {
                    "id": final.id, "content": final.content, "token_ids": final.token_ids, "token_start": start,
                    "token_end": end, "meta": final.meta,
                }
                if final.vector is not None:
                    update["embedding"] = final.vector
                self.out.updated.append(update)
        self.out.token_count = offset
