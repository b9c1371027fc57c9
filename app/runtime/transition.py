"""One transition of a session: the one function that advances a session, for every path that does.

A live turn, a compaction (asked for, or over the token budget), a forget's replay of transitions τ..T, a retrieval
session's regeneration of one reply or summary, and the forget-instruction baseline's appended message all call
`step`. It resolves the transition's context through the session's policy object (its transition half,
policies/full.py or policies/retrieval.py: the engine calls of engine_calls.py with the tool loop of tool_loop.py, or a
retrieved prompt), samples with the transition's own seed (engine_calls.sampling_for), and computes everything the
transition writes: its artifacts with exact token spans and provenance edges (records.py), its checkpoints
(checkpoints.py), the tools' environment after it, what a compaction archived, the vectors a retrieval session
stores. It writes nothing: a turn commits the `Step` under the
session's lease (writes.py, `write_step`), and a forget swaps its steps in with the same writer. So a replayed
transition and the original are computed by the same code from the same inputs, and exactness never depends on two
copies staying identical (tests/forget/test_one_transition_function.py compares them artifact by artifact).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from app.db.database import Database
from app.db.models import AgentSession
from app.embeddings import Embedder
from app.engine.protocol import KVEngine, TokenSink
from app.engine.session_caches import SessionCaches
from app.keys.content import Sealer
from app.runtime import checkpoints
from app.runtime.blocks import Block
from app.runtime.compaction import LiveRow
from app.runtime.engine_calls import Outcome, Usage
from app.runtime.provenance import Provenance
from app.runtime.records import TransitionRecords, log_entries, records_for
from app.runtime.tool_loop import ToolContext, ToolStep
from app.sessions.repositories.artifact_search import Neighbor
from app.sessions.repositories.artifacts import LogEntry

# -- what a transition runs with, and on ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Machinery:
    """What runs transitions in this process: the engine, the sessions' cache handles, the embedder, and the
    database for short reads (retrieval); never a transaction held across model work."""

    engine: KVEngine
    handles: SessionCaches
    embedder: Embedder
    db: Database
    sealer: Sealer  # the process's: what the session's content is sealed and opened with
    replay_verify: bool = True  # a forget's replay passes recorded replies as drafts (LETHE_REPLAY_VERIFY)


@dataclass
class SessionState:
    """The live prompt a transition starts from, as the database holds it or as a replay has rebuilt it so far."""

    log: list[LogEntry]
    next_position: int  # past every artifact of the session, archived ones included

    def advance(self, step: Step) -> None:
        """The state after `step` (a compaction leaves transition 0, then its own rows)."""
        if step.archived:
            self.log = [e for e in self.log if e.turn == 0]
        self.log.extend(log_entries(step.records.artifacts))
        self.next_position = max([self.next_position, *(r["position"] + 1 for r in step.records.artifacts)])

    @property
    def log_tokens(self) -> int:
        return self.log[-1].token_end if self.log else 0


@dataclass(frozen=True)
class RetrievalView:
    """The store as a forget's regeneration sees it: without the messages it removed or replaced (`exclude`), with
    the ones it made (`fresh`), which the database does not hold yet."""

    exclude: Sequence[str] = ()
    fresh: Sequence[Any] = ()  # retrieval.Fresh


@dataclass(frozen=True)
class Compaction:
    keep_last_turns: int
    live: Sequence[LiveRow]  # the live prompt with contents (what a summary folds)
    sources: Sequence[Neighbor] | None = None  # a retrieval summary regenerated from these (None: the older turns)


@dataclass(frozen=True)
class TransitionInput:
    """Transition `turn`'s inputs: its observations, rendered, and whether the model replies."""

    turn: int
    blocks: Sequence[Block] = ()
    generate: bool = True
    keep_ids: Sequence[str | None] = ()  # ids the blocks keep (a replay's untouched observations); None: new ids
    reply_id: str | None = None  # the id the reply takes (a stream announces it before the reply exists)
    tools: ToolContext | None = None  # the session's tools and their environment as the transition starts
    compaction: Compaction | None = None  # a compaction transition instead of a reply
    vectors: Sequence[list[float] | None] = ()  # known embeddings of the blocks (a regeneration's), else computed
    view: RetrievalView | None = None  # a regeneration's store
    draft: Sequence[int] | None = None  # a replay's recorded reply (or summary), verified instead of decoded


# -- a policy's transition half --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replied:
    """A transition with observations as a policy ran it: the engine's outcome (observations, then the reply and its
    tool blocks), the rule for the reply's parents, vectors to store with the blocks (in `outcome.blocks` order;
    empty when the policy stores none)."""

    outcome: Outcome
    tools: ToolStep
    provenance: Provenance
    vectors: Sequence[list[float] | None] = ()


@dataclass(frozen=True)
class Compacted:
    records: TransitionRecords  # the summary, then copies of kept rows
    archived: list[str]  # live rows it takes out of the prompt
    usage: Usage
    finish_reason: Literal["stop", "length"] | None
    summary_id: str
    summary: str
    vectors: dict[str, list[float]] = field(default_factory=dict)


class TransitionHalf(Protocol):
    """A context policy's transition half: what a reply's context is, and how it is computed on the engine."""

    async def reply(
        self, m: Machinery, row: AgentSession, state: SessionState, t: TransitionInput, on_tokens: TokenSink | None
    ) -> Replied: ...

    async def compact(self, m: Machinery, row: AgentSession, state: SessionState, t: TransitionInput) -> Compacted: ...


class SessionPolicy(Protocol):
    """A context policy as the runtime and the sessions use it (app/policies.py holds the objects and their forget
    halves)."""

    @property
    def name(self) -> str: ...

    @property
    def provenance(self) -> Provenance:
        """The parents rule of a transition that retrieved nothing (creation, empty transitions)."""
        ...

    @property
    def transitions(self) -> TransitionHalf: ...

    def check(self, tools: Sequence[object], compaction: Mapping[str, Any]) -> None:
        """Refuse (InvalidRequest) a session configuration this policy cannot honour, before anything is stored."""
        ...


class PolicyLookup(Protocol):
    def of(self, row: AgentSession) -> SessionPolicy:
        """The session's policy object, resolved once per unit of work."""
        ...

    def named(self, name: str) -> SessionPolicy:
        """The policy of that name (InvalidRequest when there is none)."""
        ...


# -- the transition --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    turn: int
    records: TransitionRecords
    checkpoints: list[checkpoints.Boundary]
    usage: Usage
    finish_reason: Literal["stop", "length"] | None = None
    tools: ToolStep = field(default_factory=ToolStep)
    environment: dict[str, Any] | None = None  # the tools' environment after the transition, when it changed
    archived: list[str] = field(default_factory=list)  # a compaction's archived rows
    embeddings: dict[str, list[float]] = field(default_factory=dict)  # artifact id → vector to store
    summary: tuple[str, str] | None = None  # a compaction's (summary artifact id, text)

    @property
    def reply(self) -> dict[str, Any] | None:
        return self.records.reply


NO_USAGE = Usage(0, 0, 0, 0, 0)


async def step(
    m: Machinery,
    row: AgentSession,
    policy: SessionPolicy,
    state: SessionState,
    t: TransitionInput,
    on_tokens: TokenSink | None = None,
) -> Step:
    """Run transition `t.turn` of session `row` from `state`: the engine work its policy asks for, and every record
    it writes. Transition 0 (the system block and injected memory) and an empty transition (no observation, no
    reply: what a forget leaves where an observation held only the target) touch no engine."""
    if t.compaction is not None:
        done = await policy.transitions.compact(m, row, state, t)
        return Step(
            t.turn, done.records, _marks(row, t.turn, done.records), done.usage, done.finish_reason,
            archived=done.archived, embeddings=done.vectors, summary=(done.summary_id, done.summary),
        )
    if t.turn == 0 or (not t.blocks and not t.generate):
        records = records_for(row.tenant_id, row.id, t.turn, state.log, t.blocks, None, policy.provenance, t.keep_ids)
        return Step(t.turn, records, _marks(row, t.turn, records), NO_USAGE)
    replied = await policy.transitions.reply(m, row, state, t, on_tokens)
    outcome = replied.outcome
    records = records_for(
        row.tenant_id, row.id, t.turn, state.log, outcome.blocks, outcome, replied.provenance,
        _kept_ids(outcome, t.keep_ids, t.reply_id),
    )
    vectors = {a["id"]: v for a, v in zip(records.artifacts, replied.vectors, strict=False) if v is not None}
    environment = None
    if t.tools is not None and replied.tools.env_changed:
        environment = copy.deepcopy(t.tools.env)
    return Step(
        t.turn, records, _marks(row, t.turn, records), outcome.usage, outcome.finish_reason, replied.tools,
        environment, embeddings=vectors,
    )


def _marks(row: AgentSession, turn: int, records: TransitionRecords) -> list[checkpoints.Boundary]:
    if turn == 0:
        return checkpoints.at_session_start(row.checkpoint_policy, records.manifest_after)
    return checkpoints.for_transition(
        row.checkpoint_policy, turn, records.kinds, records.manifest_before, records.manifest_after
    )


def _kept_ids(outcome: Outcome, keep_ids: Sequence[str | None], reply_id: str | None) -> list[str | None]:
    """The id each of the outcome's blocks keeps: the observations' `keep_ids`, the reply's `reply_id`, none for the
    rest (tool calls and results get new ids)."""
    ids: list[str | None] = [*keep_ids, *([None] * len(outcome.blocks))][: len(outcome.blocks)]
    index = next((i for i, b in enumerate(outcome.blocks) if b is outcome.reply), None)
    if index is not None and reply_id is not None:
        ids[index] = reply_id
    return ids
