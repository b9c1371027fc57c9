"""The `retrieval` context policy's transition half (DeLLM, retrieval.py): a reply sees the preamble and the stored
messages retrieved for its question, and every message gets its embedding in the commit that stores it.

A compaction writes a summary message derived from the older messages, which stay in the store (a prompt holds only
what retrieval picks, so nothing needs to leave it). Its parents are its sources, so deleting one reaches it, and a
forget regenerates it from the rest.

The same calls serve a live turn and a forget's regeneration of one output: the regeneration passes the store as it
will be (`TransitionInput.view`) and the vectors it already knows, so an output whose context did not change is
produced again token for token.
"""

from __future__ import annotations

from app.db.models import AgentSession
from app.engine.protocol import TokenSink
from app.errors import Conflict
from app.runtime import retrieval
from app.runtime.compaction import split_older
from app.runtime.engine_calls import Outcome, sampling_for
from app.runtime.provenance import RetrievedContext
from app.runtime.records import records_for
from app.runtime.routing import route_of
from app.runtime.salts import salt_of
from app.runtime.tool_loop import ToolStep
from app.runtime.transition import NO_USAGE, Compacted, Machinery, Replied, SessionState, TransitionInput
from app.sessions.repositories.artifact_search import Neighbor


class RetrievalTransitions:
    async def reply(
        self, m: Machinery, row: AgentSession, state: SessionState, t: TransitionInput, on_tokens: TokenSink | None
    ) -> Replied:
        """Store the observations, and answer them from the preamble and the messages retrieved for them."""
        await retrieval.embed_missing(m.db, m.sealer, m.embedder, row.id)
        blocks = list(t.blocks)
        vectors = await self._vectors(m, t)
        if not t.generate:
            return Replied(Outcome(blocks, None, NO_USAGE, None, 0, None), ToolStep(), RetrievedContext(), vectors)
        query = await retrieval.query_vector(m.embedder, blocks, vectors)
        view = t.view
        async with m.db.transaction() as tx:
            context = await retrieval.retrieve(
                tx, m.sealer, row.id, query, retrieval.Params.of(row.retrieval), t.turn,
                exclude=view.exclude if view else (), fresh=view.fresh if view else (),
            )
        preamble_ids, preamble_tokens = retrieval.preamble(state.log)
        answer = await retrieval.respond(
            m.engine, m.handles, route_of(row), salt_of(row), preamble_tokens, context, blocks,
            lambda room: sampling_for(row.sampling, t.turn, room), on_tokens,
            None if t.draft is None else list(t.draft),
        )
        reply_vector = (await m.embedder.embed([answer.reply.content]))[0]
        outcome = Outcome([*blocks, answer.reply], answer.reply, answer.usage, answer.finish_reason, 0, None)
        provenance = RetrievedContext(preamble_ids, [message.id for message in context])
        return Replied(outcome, ToolStep(), provenance, [*vectors, reply_vector])

    async def _vectors(self, m: Machinery, t: TransitionInput) -> list[list[float]]:
        """The blocks' embeddings: the ones the caller knows (a regeneration's stored vectors), the rest computed."""
        known = list(t.vectors) + [None] * (len(t.blocks) - len(t.vectors))
        missing = [i for i, v in enumerate(known) if v is None]
        computed = await m.embedder.embed([t.blocks[i].content for i in missing])
        for i, vector in zip(missing, computed, strict=True):
            known[i] = vector
        return [v for v in known if v is not None]

    async def compact(self, m: Machinery, row: AgentSession, state: SessionState, t: TransitionInput) -> Compacted:
        assert t.compaction is not None
        sources = list(t.compaction.sources) if t.compaction.sources is not None else _older_messages(t)
        if not sources:
            raise Conflict("nothing to summarize: the older turns hold no messages")
        preamble_ids, preamble_tokens = retrieval.preamble(state.log)
        answer = await retrieval.summarize(
            m.engine, m.handles, route_of(row), salt_of(row), preamble_tokens, sources,
            lambda room: sampling_for(row.sampling, t.turn, room), None if t.draft is None else list(t.draft),
        )
        outcome = Outcome([answer.reply], answer.reply, answer.usage, answer.finish_reason, 0, None)
        provenance = RetrievedContext(preamble_ids, [source.id for source in sources])
        records = records_for(row.tenant_id, row.id, t.turn, state.log, [answer.reply], outcome, provenance)
        summary = records.artifacts[0]
        vector = (await m.embedder.embed([summary["content"]]))[0]
        return Compacted(
            records, [], answer.usage, answer.finish_reason, summary["id"], summary["content"], {summary["id"]: vector}
        )


def _older_messages(t: TransitionInput) -> list[Neighbor]:
    """What a compaction summarizes: the messages of the turns it does not keep, in log order."""
    assert t.compaction is not None
    _, summarized, _ = split_older(t.compaction.live, t.compaction.keep_last_turns)
    return [
        Neighbor(r.id, r.kind, r.turn, position, r.content, r.source_ids, 0.0)
        for position, r in enumerate(summarized)
        if r.kind in retrieval.CONTEXT_KINDS
    ]
