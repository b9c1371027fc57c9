"""How a forget is carried out in a session, by its context policy: each policy's forget half (the policy object
that carries it with its turn and provenance halves is app/policies.py, resolved once per session).

- `full`: the prompt is the log. A forget rolls the cache back to a restore point and replays the transitions after
  it (replay.py): selective replays τ..T from the latest valid checkpoint before τ, full replays everything on a
  cold cache; deleting dependents rewrites the log without the closure and re-prefills it from the first edit. Its
  cost is the replayed suffix's.
- `retrieval` (DeLLM): the prompt is built per turn from a store; the cache holds only the preamble. A forget
  regenerates outputs one by one (regenerate.py), and its cost is the outputs it regenerates.

Strategies (strategies.py) decide *what* is forgotten; the policy decides *how* in that kind of session, for every
strategy: the baselines that edit in place (`rewrite`) and append an instruction (`instruct`) go through it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from app.db.models import AgentSession, Artifact, Checkpoint
from app.errors import InvalidRequest
from app.forget import regenerate as regen
from app.forget.closure import ClosureEntry, Restore, restore_point
from app.forget.cost import Yardstick
from app.forget.locate import Located
from app.forget.receipts import RestorePoint
from app.forget.replay import replay
from app.forget.rewrite import append_instruction, rewrite
from app.forget.session_work import Change, SessionWork
from app.runtime.blocks import MODEL_KINDS
from app.runtime.salts import rotates
from app.runtime.transition import SessionPolicy


@dataclass(frozen=True)
class Estimate:
    """What a dry run expects a replaying forget to compute in one session."""

    transitions_replayed: int
    reused: int  # tokens of the clean prefix kept
    recompute_estimate: int
    checkpoint: RestorePoint | None = None  # the restore point (None: nothing reused)


class ForgetPolicy(Protocol):
    name: str
    holds_log: bool  # the session's cache holds its whole log (a rewrite re-prefills it from the first edit)

    def supports(self, strategy: str) -> bool:
        """Whether a forget strategy (strategies.py, by name) can forget in a session of this policy."""
        ...

    async def selective(self, work: SessionWork) -> Change:
        """The session that never saw the target, recomputing only what the target reached."""
        ...

    async def full(self, work: SessionWork) -> Change:
        """The same session recomputed from nothing: the reference `selective` must equal."""
        ...

    async def delete(self, work: SessionWork) -> Change:
        """The target and everything derived from it deleted, nothing regenerated."""
        ...

    def estimate(
        self, session: AgentSession, rows: Sequence[Artifact], located: Located, closure: Sequence[ClosureEntry],
        checkpoints: Sequence[Checkpoint], yardstick: Yardstick, *, cold: bool,
    ) -> Estimate:
        """What `selective` (or, `cold`, `full`) is expected to compute; `rows`: every artifact, archived ones too."""
        ...

    def rotates_salt(self, log_before: Sequence[int], log_after: Sequence[int]) -> bool:
        """Whether the forget must give the session a new cache salt (runtime/salts.py)."""
        ...

    async def rewrite(
        self, work: SessionWork, *, drop: set[str], edits: dict[str, str | None], redact: str | None = None
    ) -> Change:
        """Artifacts deleted (`drop`), observations edited and `redact` stripped from every artifact; nothing
        regenerated (the cheaper baselines)."""
        ...

    async def instruct(self, work: SessionWork, instruction: str) -> Change:
        """One more transition asking the model to forget (the forget-instruction baseline)."""
        ...


class FullForget:
    name = "full"
    holds_log = True

    def supports(self, strategy: str) -> bool:
        return True

    async def selective(self, work: SessionWork) -> Change:
        tau = work.located.tau
        restore = restore_point(work.checkpoints, work.rows, tau)
        return await replay(
            work.m, work.policy, work.session, work.rows, work.located, restore, from_turn=tau,
            tools=await work.tools_before(tau),
        )

    async def full(self, work: SessionWork) -> Change:
        # Every transition regenerated on a cold cache; the system block (transition 0) is re-prefilled unless the
        # target sits in it, in which case it is re-rendered too.
        from_turn = min(work.located.tau, 1)
        system = [r for r in work.rows if r.turn == 0]
        restore = Restore(0, system[-1].token_end if system else 0, None) if from_turn == 1 else Restore(-1, 0, None)
        return await replay(
            work.m, work.policy, work.session, work.rows, work.located, restore, from_turn=from_turn,
            tools=await work.tools_before(from_turn), cold=True,
        )

    async def delete(self, work: SessionWork) -> Change:
        # A text target's observation is sanitized rather than deleted.
        sanitized = {i for i, content in work.located.edits.items() if content is not None}
        drop = {entry.artifact_id for entry in work.closure} - sanitized
        change = await rewrite(
            work.m, work.session, work.live_rows, drop=drop, edits=dict(work.located.edits), holds_log=self.holds_log
        )
        change.deleted.extend(r.id for r in work.rows if r.archived_by is not None and r.id in drop)
        return change

    async def rewrite(
        self, work: SessionWork, *, drop: set[str], edits: dict[str, str | None], redact: str | None = None
    ) -> Change:
        return await rewrite(
            work.m, work.session, work.live_rows, drop=drop, edits=edits, redact=redact, holds_log=self.holds_log
        )

    async def instruct(self, work: SessionWork, instruction: str) -> Change:
        return await append_instruction(work.m, work.policy, work.session, work.live_rows, instruction)

    def estimate(
        self, session: AgentSession, rows: Sequence[Artifact], located: Located, closure: Sequence[ClosureEntry],
        checkpoints: Sequence[Checkpoint], yardstick: Yardstick, *, cold: bool,
    ) -> Estimate:
        restore = restore_point(checkpoints, rows, located.tau)
        after = [r for r in rows if r.archived_by is None and r.token_start >= restore.token_offset]
        return Estimate(
            transitions_replayed=session.turns - restore.turn,
            reused=restore.token_offset,
            # What the contaminated suffix cost; the rebuilt one is about as long, less the target.
            recompute_estimate=yardstick.run(session.token_count - restore.token_offset, after),
            checkpoint=_checkpoint(restore),
        )

    def rotates_salt(self, log_before: Sequence[int], log_after: Sequence[int]) -> bool:
        return rotates(log_before, log_after)


class RetrievalForget:
    name = "retrieval"
    holds_log = False  # the cache holds only the preamble, never the store (runtime/retrieval.py)
    # No running prompt to append an instruction to, and no tool calls for a sink policy to guard.
    UNSUPPORTED: Final = frozenset({"forget_instruction", "ifc", "ifc_replay"})

    def supports(self, strategy: str) -> bool:
        return strategy not in self.UNSUPPORTED

    async def selective(self, work: SessionWork) -> Change:
        return await regen.regenerate(work, "selective")

    async def full(self, work: SessionWork) -> Change:
        return await regen.regenerate(work, "full")

    async def delete(self, work: SessionWork) -> Change:
        return await regen.regenerate(work, "delete")

    async def rewrite(
        self, work: SessionWork, *, drop: set[str], edits: dict[str, str | None], redact: str | None = None
    ) -> Change:
        return await rewrite(
            work.m, work.session, work.live_rows, drop=drop, edits=edits, redact=redact, holds_log=self.holds_log
        )

    async def instruct(self, work: SessionWork, instruction: str) -> Change:
        raise InvalidRequest("a retrieval session has no running prompt to append an instruction to")  # not supported

    def estimate(
        self, session: AgentSession, rows: Sequence[Artifact], located: Located, closure: Sequence[ClosureEntry],
        checkpoints: Sequence[Checkpoint], yardstick: Yardstick, *, cold: bool,
    ) -> Estimate:
        # Outputs are regenerated one by one, not a suffix replayed: the estimate is Dep(M)'s outputs (every output
        # for a cold run).
        outputs = [r for r in rows if r.archived_by is None and r.kind in MODEL_KINDS]
        if not cold:
            sources = set(located.sources)
            reached = {entry.artifact_id for entry in closure}
            outputs = [r for r in outputs if r.id in reached and r.id not in sources]
        return Estimate(
            transitions_replayed=len(outputs), reused=0,
            recompute_estimate=sum(len(r.token_ids) for r in outputs) + yardstick.reread(outputs),
        )

    def rotates_salt(self, log_before: Sequence[int], log_after: Sequence[int]) -> bool:
        return rotates(log_before, log_after, retrieval=True)


class PolicyWithForget(SessionPolicy, Protocol):
    """A context policy as the forget machinery uses it: the runtime's halves and its forget half."""

    @property
    def forget(self) -> ForgetPolicy: ...


class ForgetLookup(Protocol):
    """The policy registry, handed down by the composition root (app/policies.py builds it; importing it from here
    would make a cycle: it joins this package's halves with the runtime's)."""

    def of(self, row: AgentSession) -> PolicyWithForget: ...


def _checkpoint(restore: Restore) -> RestorePoint | None:
    return RestorePoint(turn=restore.turn, token_offset=restore.token_offset) if restore.turn >= 0 else None
