"""A context policy's half of a session's life: how a turn runs under it and how it compacts.

A session's `context_policy` names one (policies/__init__.py maps the name once); the forget service keeps the
other half (how a forget is carried out and costed) under the same names. What a model call's provenance is under
each policy is app/runtime/context.py; each policy here carries its context object.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.db.repositories.artifacts import LogEntry
from app.db.session import Database
from app.embeddings import Embedder
from app.engine.protocol import KVEngine, TokenSink
from app.runtime.blocks import Block
from app.runtime.compaction import LiveRow
from app.runtime.context import ContextPolicy
from app.runtime.handles import HandleRegistry
from app.runtime.records import TransitionRecords
from app.runtime.tooling import ToolStep
from app.runtime.transition import Outcome

# A transition's writes, run by the caller in the commit that checks the session is still leased to it: the
# transaction, and the session row locked in it.
Write = Callable[[AsyncSession, AgentSession], Awaitable[None]]


@dataclass(frozen=True)
class Transition:
    """Transition `turn` of a leased session: the session as leased, the stored log it starts from, the database
    to read from (short transactions: under the lease nothing else writes the session), and what runs it (this
    process's engine, cache handles and embedder). No transaction is open while it runs."""

    db: Database
    row: AgentSession
    turn: int
    log: list[LogEntry]
    engine: KVEngine
    handles: HandleRegistry
    embedder: Embedder


@dataclass(frozen=True)
class TurnRun:
    outcome: Outcome
    records: TransitionRecords
    step: ToolStep  # what the reply's tool calls did
    write: Write  # the transition's artifacts, edges, checkpoints and tool ledger


@dataclass(frozen=True)
class Summary:
    artifact_id: str
    text: str
    write: Write  # the compaction transition


class TurnPolicy(Protocol):
    name: str
    context: ContextPolicy  # the provenance of a transition that retrieved nothing (creation, an empty transition)

    async def run_turn(
        self, t: Transition, blocks: list[Block], generate: bool, on_tokens: TokenSink | None, reply_id: str | None
    ) -> TurnRun:
        """Run the transition on the engine; what it writes is the returned run's `write`."""
        ...

    async def compact(self, t: Transition, live: Sequence[LiveRow], keep_last_turns: int) -> Summary:
        """Run a compaction transition that folds all but the last `keep_last_turns` turns of `live` into a
        summary (the caller checked there is something to fold); what it writes is the summary's `write`."""
        ...


def reply_keep_ids(outcome: Outcome, reply_id: str | None) -> list[str | None]:
    """keep_ids for records_for that give the reply block the id `reply_id` (nothing else keeps one)."""
    if reply_id is None or outcome.reply is None:
        return []
    index = next((i for i, b in enumerate(outcome.blocks) if b is outcome.reply), None)
    return [] if index is None else [*([None] * index), reply_id]
