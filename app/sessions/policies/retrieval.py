"""The `retrieval` context policy (DeLLM, runtime/retrieval.py): a reply sees the preamble and the stored messages
retrieved for its question, and every message gets its embedding in the commit that stores it.

A compaction writes a summary message derived from the older messages, which stay in the store (a prompt holds only
what retrieval picks, so nothing needs to leave it). Its parents are its sources, so deleting one reaches it, and a
forget regenerates it from the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.db.repositories import artifact_search as search_repo
from app.engine.protocol import TokenSink
from app.errors import Conflict
from app.runtime import retrieval
from app.runtime.blocks import Block
from app.runtime.compaction import LiveRow, split_older
from app.runtime.context import ContextPolicy, RetrievedContext
from app.runtime.records import records_for
from app.runtime.salts import route_of, salt_of
from app.runtime.tooling import ToolStep
from app.runtime.transition import Outcome, Usage, sampling_for
from app.sessions.policies.base import Summary, Transition, TurnRun, reply_keep_ids
from app.sessions.writes import write_transition


class RetrievalTurns:
    name: str = "retrieval"
    # Without a retrieval of its own, a reply's parents are only its turn's observations.
    context: ContextPolicy = RetrievedContext()

    async def run_turn(
        self, t: Transition, blocks: list[Block], generate: bool, on_tokens: TokenSink | None, reply_id: str | None
    ) -> TurnRun:
        """Store the observations, and answer them from the preamble and the messages retrieved for them."""
        row, embedder = t.row, t.embedder
        async with t.db.transaction() as tx:
            await retrieval.embed_missing(tx, embedder, row.id)
        vectors = await embedder.embed([b.content for b in blocks])
        preamble_ids, preamble_tokens = retrieval.preamble(t.log)
        context: list[search_repo.Neighbor] = []
        answer = None
        if generate:
            query = vectors[0] if len(blocks) == 1 else (await embedder.embed([retrieval.query_text(blocks)]))[0]
            async with t.db.transaction() as tx:
                context = await retrieval.retrieve(tx, row.id, query, retrieval.Params.of(row.retrieval), t.turn)
            answer = await retrieval.respond(
                t.engine, t.handles, row.id, salt_of(row), preamble_tokens, context, blocks,
                lambda room: sampling_for(row.sampling, t.turn, room), on_tokens, route=route_of(row),
            )
        reply = None if answer is None else answer.reply
        usage = Usage(0, 0, 0, 0, 0) if answer is None else answer.usage
        outcome = Outcome(
            [*blocks, *([reply] if reply else [])], reply, usage, None if answer is None else answer.finish_reason,
            0, None,
        )
        parents = RetrievedContext(preamble_ids, [m.id for m in context])
        records = records_for(
            row.tenant_id, row.id, t.turn, t.log, outcome.blocks, outcome, parents, reply_keep_ids(outcome, reply_id)
        )
        if reply is not None:
            vectors.extend(await embedder.embed([reply.content]))
        embeddings = {a["id"]: v for a, v in zip(records.artifacts, vectors, strict=True)}

        async def write(tx: AsyncSession, locked: AgentSession) -> None:
            await write_transition(tx, locked, t.turn, records)
            await search_repo.set_embeddings(tx, embeddings)

        return TurnRun(outcome, records, ToolStep(), write)

    async def compact(self, t: Transition, live: Sequence[LiveRow], keep_last_turns: int) -> Summary:
        row = t.row
        _, summarized, _ = split_older(live, keep_last_turns)
        sources = [
            search_repo.Neighbor(r.id, r.kind, r.turn, position, r.content, r.source_ids, 0.0)
            for position, r in enumerate(summarized)
            if r.kind in retrieval.CONTEXT_KINDS
        ]
        if not sources:
            raise Conflict("nothing to summarize: the older turns hold no messages")
        preamble_ids, preamble_tokens = retrieval.preamble(t.log)
        answer = await retrieval.summarize(
            t.engine, t.handles, row.id, salt_of(row), preamble_tokens, sources,
            lambda room: sampling_for(row.sampling, t.turn, room), route=route_of(row),
        )
        outcome = Outcome([answer.reply], answer.reply, answer.usage, answer.finish_reason, 0, None)
        parents = RetrievedContext(preamble_ids, [m.id for m in sources])
        records = records_for(row.tenant_id, row.id, t.turn, t.log, [answer.reply], outcome, parents)
        summary = records.artifacts[0]
        vector = (await t.embedder.embed([summary["content"]]))[0]

        async def write(tx: AsyncSession, locked: AgentSession) -> None:
            await write_transition(tx, locked, t.turn, records)
            await search_repo.set_embeddings(tx, {summary["id"]: vector})

        return Summary(summary["id"], summary["content"], write)
