"""Forget strategies behind one interface: what a forget does to one session, under that session's row lock.

Every strategy gets the same `SessionWork` (the session, its live artifacts, the located target, its taint closure
and checkpoints) and returns one of three changes, which the service swaps in the same way for all:

- `Rebuilt`: transitions from some turn on are replaced (replay.py): `selective_replay` (Algorithm 1: restore at the
  latest checkpoint before τ, replay τ..T) and `full_reset` (the reference: replay every transition on a cold cache);
- `Rewritten`: artifacts deleted or edited in place and nothing regenerated (rewrite.py): `delete_dependents` (DeLLM:
  the message and everything whose context reached it) and its baseline twin `sanitize_no_replay` (B4),
  `source_redaction` (B3: the source only, derived artifacts kept), `sanitized_rebuild` (B6: the text stripped from
  every artifact, the cache rebuilt); `forget_instruction` (B2) appends a message as a `Rebuilt` transition;
- `None`: the session is left as it is: `no_forget` (B0), `memory_delete` (B1: only the memory record goes) and
  `ifc` (B8: the target's sources are flagged so a sink policy blocks consequential calls derived from them);
  `ifc_replay` (B9) is selective replay plus that flag.

In a retrieval session (DeLLM, runtime/retrieval.py) outputs are regenerated one by one instead of a prefix replayed
(regenerate.py): `selective_replay` regenerates Dep(M) and whatever else would now retrieve another context,
`full_reset` every output, `delete_dependents` deletes Dep(M) and rebuilds only summaries. `semantic_deletion` is
DeLLM's semantic-deletion baseline in either policy: every artifact, model outputs included, whose embedding is
similar enough to a query target is deleted, with no provenance at all. Strategies that need a growing prompt or
tools (`forget_instruction`, `ifc`, `ifc_replay`) refuse retrieval sessions.

The baselines exist for the evaluation harness: they leave the target in derived state by design, which is what the
paper measures. Only `selective_replay`, `full_reset` and `delete_dependents` are forgetting in the product's sense.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession, Artifact, Checkpoint
from app.db.repositories import tools as tools_repo
from app.embeddings import Embedder
from app.engine.protocol import KVEngine
from app.errors import InvalidRequest
from app.forget import regenerate as regen
from app.forget.plan import Restore, Tainted, restore_point
from app.forget.replay import Rebuilt, replay
from app.forget.rewrite import Rewritten, append_instruction, rewrite
from app.forget.targets import Located, only_model_outputs
from app.runtime.handles import HandleRegistry
from app.runtime.tooling import ReplayTools, ToolContext

Change = Rebuilt | Rewritten | None


@dataclass(frozen=True)
class SessionWork:
    tx: AsyncSession  # the session's locked transaction: read what the strategy needs, write nothing
    engine: KVEngine
    handles: HandleRegistry
    session: AgentSession
    rows: list[Artifact]
    located: Located
    closure: list[Tainted]
    checkpoints: list[Checkpoint]
    embedder: Embedder
    provided: dict[str, str] = field(default_factory=dict)  # the client's answers to calls a replay made anew
    similar: list[str] = field(default_factory=list)  # semantic_deletion: every artifact matching the query

    @property
    def retrieval(self) -> bool:
        return self.session.context_policy == "retrieval"

    @property
    def live_rows(self) -> list[Artifact]:
        """The live prompt (`rows` also holds what compactions archived, which a replay needs)."""
        return [r for r in self.rows if r.archived_by is None]

    async def tools_before(self, turn: int) -> ToolContext | None:
        """The session's tools for a replay from `turn`: the environment as snapshotted before it, the ledger of
        fired calls, and the original run's results (A3: identical calls reuse them)."""
        if not self.session.tools:
            return None
        _, env = await tools_repo.environment(self.tx, self.session.id, before_turn=turn)
        fired = await tools_repo.fired(self.tx, self.session.id)
        recorded = {
            str(r.meta["tool_call_id"]): r.content
            for r in self.rows
            if r.kind == "tool_result" and (r.meta or {}).get("tool_call_id")
        }
        calls = {str(r.meta.get("tool_call_id")) for r in self.rows if r.kind == "tool_call" and r.meta}
        replay = ReplayTools(recorded=recorded, original_calls=calls, provided=dict(self.provided))
        return ToolContext(
            self.session.id, self.session.tools, env, fired, frozenset(self.session.flagged_sources), replay
        )


BOTH: Final = frozenset({"full", "retrieval"})


class ForgetStrategy(Protocol):
    name: str
    policies: frozenset[str]  # the context policies of the sessions it can forget in
    targets: frozenset[str] | None  # the target kinds it takes (None: any)
    matches_outputs: bool  # its matching reaches model outputs too (SessionWork.similar)
    replays: bool  # regenerates model outputs (needs a reply-capable engine and may take a while)
    forgets_memory: bool  # a memory target's record is tombstoned
    flags_sources: bool  # the target's sources join the session's sink policy (information-flow control)
    cleans_derived_memory: bool  # memory records written back from the closure (a summary) are tombstoned too

    def check(self, located: Located) -> None:
        """Refuse (InvalidRequest) a target this strategy cannot forget, before any job is queued."""
        ...

    async def apply(self, work: SessionWork) -> Change: ...


class _Base:
    name = ""
    policies: frozenset[str] = BOTH
    targets: frozenset[str] | None = None
    matches_outputs = False
    replays = False
    forgets_memory = True
    flags_sources = False
    cleans_derived_memory = False

    def check(self, located: Located) -> None:
        return None


class SelectiveReplay(_Base):
    name = "selective_replay"
    replays = True
    cleans_derived_memory = True

    def check(self, located: Located) -> None:
        _refuse_outputs_only(self.name, located)

    async def apply(self, work: SessionWork) -> Change:
        if work.retrieval:
            return await regen.regenerate(work, "selective")
        tau = work.located.tau
        restore = restore_point(work.checkpoints, work.rows, tau)
        return await replay(
            work.engine, work.handles, work.session, work.rows, work.located, restore, from_turn=tau,
            tools=await work.tools_before(tau),
        )


class FullReset(_Base):
    name = "full_reset"
    replays = True
    cleans_derived_memory = True

    def check(self, located: Located) -> None:
        _refuse_outputs_only(self.name, located)

    async def apply(self, work: SessionWork) -> Change:
        if work.retrieval:
            return await regen.regenerate(work, "full")
        # Every transition regenerated on a cold cache; the system block (transition 0) is re-prefilled unless the
        # target sits in it, in which case it is re-rendered too.
        from_turn = min(work.located.tau, 1)
        system = [r for r in work.rows if r.turn == 0]
        restore = Restore(0, system[-1].token_end if system else 0, None) if from_turn == 1 else Restore(-1, 0, None)
        return await replay(
            work.engine, work.handles, work.session, work.rows, work.located, restore, from_turn=from_turn,
            tools=await work.tools_before(from_turn), cold=True,
        )


class DeleteDependents(_Base):
    """DeLLM on the provenance graph: remove the target and every artifact whose context reached it (a text target's
    observation is sanitized rather than deleted); regenerate nothing."""

    name = "delete_dependents"
    cleans_derived_memory = True

    async def apply(self, work: SessionWork) -> Change:
        if work.retrieval:
            return await regen.regenerate(work, "delete")
        sanitized = {i for i, content in work.located.edits.items() if content is not None}
        drop = {t.artifact_id for t in work.closure} - sanitized
        change = await rewrite(
            work.engine, work.handles, work.session, work.live_rows, drop=drop, edits=dict(work.located.edits)
        )
        change.deleted.extend(r.id for r in work.rows if r.archived_by is not None and r.id in drop)
        return change


class SanitizeNoReplay(DeleteDependents):
    name = "sanitize_no_replay"  # B4: the same operation, named as the paper's baseline


class SourceRedaction(_Base):
    name = "source_redaction"  # B3: drop (or redact) the source block, keep everything derived from it

    async def apply(self, work: SessionWork) -> Change:
        return await rewrite(
            work.engine, work.handles, work.session, work.live_rows, drop=set(), edits=dict(work.located.edits)
        )


class SanitizedRebuild(_Base):
    name = "sanitized_rebuild"  # B6: string-redact the whole transcript (model outputs too), rebuild the cache

    async def apply(self, work: SessionWork) -> Change:
        return await rewrite(
            work.engine, work.handles, work.session, work.live_rows, drop=set(), edits=dict(work.located.edits),
            redact=work.located.span,
        )


class ForgetInstruction(_Base):
    name = "forget_instruction"  # B2: append "forget z" and keep everything
    policies = frozenset({"full"})  # a retrieval session has no running prompt to append to

    async def apply(self, work: SessionWork) -> Change:
        what = work.located.span or "the earlier message I asked you to forget"
        instruction = f"Forget the following and never use, repeat or act on it again: {what}"
        return await append_instruction(work.engine, work.handles, work.session, work.live_rows, instruction)


class NoForget(_Base):
    name = "no_forget"  # B0
    forgets_memory = False

    async def apply(self, work: SessionWork) -> Change:
        return None


class MemoryDelete(_Base):
    name = "memory_delete"  # B1: the memory record is tombstoned; sessions are untouched

    async def apply(self, work: SessionWork) -> Change:
        return None


class SinkPolicy(_Base):
    """B8, FIDES-style information-flow control: flag the target's sources so no consequential tool call whose
    context holds them fires; the contaminated state itself is left as it is."""

    name = "ifc"
    policies = frozenset({"full"})  # a sink policy guards tool calls, and retrieval sessions have none
    flags_sources = True
    forgets_memory = False

    async def apply(self, work: SessionWork) -> Change:
        return None


class SinkPolicyReplay(SelectiveReplay):
    name = "ifc_replay"  # B9: the sink policy and selective replay together
    policies = frozenset({"full"})
    flags_sources = True


class SemanticDeletion(_Base):
    """DeLLM's semantic-deletion baseline: delete every artifact (model outputs too) at least `min_similarity`
    similar to the query, follow no provenance, regenerate nothing. What it misses is what provenance finds: a
    reply that used the fact without repeating its words."""

    name = "semantic_deletion"
    targets: frozenset[str] | None = frozenset({"query"})
    matches_outputs = True

    async def apply(self, work: SessionWork) -> Change:
        drop = set(work.similar) | {i for i, content in work.located.edits.items() if content is None}
        return await rewrite(work.engine, work.handles, work.session, work.live_rows, drop=drop, edits={})


def _refuse_outputs_only(name: str, located: Located) -> None:
    if only_model_outputs(located):
        raise InvalidRequest(
            f"{name} sanitizes observations and regenerates what followed, and the target is only in model "
            "outputs: regenerating them from the same inputs reproduces them. Forget the observation it came from, "
            "or use delete_dependents."
        )


STRATEGIES: Mapping[str, ForgetStrategy] = {
    s.name: s
    for s in (
        SelectiveReplay(), FullReset(), DeleteDependents(), SanitizeNoReplay(), SourceRedaction(),
        SanitizedRebuild(), ForgetInstruction(), NoForget(), MemoryDelete(), SinkPolicy(), SinkPolicyReplay(),
        SemanticDeletion(),
    )
}
