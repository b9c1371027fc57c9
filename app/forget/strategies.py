"""Forget strategies behind one interface: what a forget does to one session, under that session's lease.

Every strategy gets the same `SessionWork` (session_work.py: the session, its live artifacts, the located target, its
closure and checkpoints) and the session's context policy (policies.py), and returns one of three changes, which the
executor swaps in the same way for all:

- `Rebuilt`: transitions from some turn on are replaced (replay.py): `selective_replay` (Algorithm 1: restore at the
  latest checkpoint before τ, replay τ..T) and `full_reset` (the reference: replay every transition on a cold cache);
- `Rewritten`: artifacts deleted or edited in place and nothing regenerated (rewrite.py): `delete_dependents` (DeLLM:
  the message and everything whose context reached it) and its baseline twin `sanitize_no_replay` (B4),
  `source_redaction` (B3: the source only, derived artifacts kept), `sanitized_rebuild` (B6: the text stripped from
  every artifact, the cache rebuilt); `forget_instruction` (B2) appends a message as a `Rebuilt` transition;
- `None`: the session is left as it is: `no_forget` (B0), `memory_delete` (B1: only the memory record goes) and
  `ifc` (B8: the target's sources are flagged so a sink policy blocks consequential calls derived from them);
  `ifc_replay` (B9) is selective replay plus that flag.

The forgetting strategies ask the policy how: in a retrieval session (DeLLM, runtime/retrieval.py) outputs are
regenerated one by one instead of a prefix replayed (regenerate.py): `selective_replay` regenerates the closure and
whatever else would now retrieve another context, `full_reset` every output, `delete_dependents` deletes the closure
and rebuilds only summaries. `semantic_deletion` is
DeLLM's semantic-deletion baseline in either policy: every artifact, model outputs included, whose embedding is
similar enough to a query target is deleted, with no provenance at all. Strategies that need a growing prompt or
tools (`forget_instruction`, `ifc`, `ifc_replay`) refuse retrieval sessions.

The baselines exist for the evaluation harness: they leave the target in derived state by design, which is what the
paper measures. Only `selective_replay`, `full_reset` and `delete_dependents` are forgetting in the product's sense.
"""

from __future__ import annotations

from typing import Final, Protocol

from app.errors import InvalidRequest
from app.forget.locate import Located, only_model_outputs
from app.forget.per_policy import ForgetPolicy
from app.forget.session_work import Change, SessionWork
from app.registry import Registry


class ForgetStrategy(Protocol):
    name: str
    targets: frozenset[str] | None  # the target kinds it takes (None: any)
    matches_outputs: bool  # its matching reaches model outputs too (SessionWork.similar)
    replays: bool  # regenerates model outputs (needs a reply-capable engine and may take a while)
    cold: bool  # recomputes everything, reusing nothing (its estimate is a full recomputation's)
    forgets_memory: bool  # a memory target's record is tombstoned
    flags_sources: bool  # the target's sources join the session's sink policy (information-flow control)
    cleans_derived_memory: bool  # memory records written back from the closure (a summary) are tombstoned too

    def check(self, located: Located) -> None:
        """Refuse (InvalidRequest) a target this strategy cannot forget, before any job is queued."""
        ...

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change: ...


class _Base:
    name = ""
    targets: frozenset[str] | None = None
    matches_outputs = False
    replays = False
    cold = False
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

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        return await policy.selective(work)


class FullReset(_Base):
    name = "full_reset"
    replays = True
    cold = True
    cleans_derived_memory = True

    def check(self, located: Located) -> None:
        _refuse_outputs_only(self.name, located)

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        return await policy.full(work)


class DeleteDependents(_Base):
    """DeLLM on the provenance graph: remove the target and every artifact whose context reached it; regenerate
    nothing."""

    name = "delete_dependents"
    cleans_derived_memory = True

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        return await policy.delete(work)


class SanitizeNoReplay(DeleteDependents):
    name = "sanitize_no_replay"  # B4: the same operation, named as the paper's baseline


class SourceRedaction(_Base):
    name = "source_redaction"  # B3: drop (or redact) the source block, keep everything derived from it

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        return await policy.rewrite(work, drop=set(), edits=dict(work.located.edits))


class SanitizedRebuild(_Base):
    name = "sanitized_rebuild"  # B6: string-redact the whole transcript (model outputs too), rebuild the cache

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        return await policy.rewrite(work, drop=set(), edits=dict(work.located.edits), redact=work.located.span)


class ForgetInstruction(_Base):
    name = "forget_instruction"  # B2: append "forget z" and keep everything

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        what = work.located.span or "the earlier message I asked you to forget"
        instruction = f"Forget the following and never use, repeat or act on it again: {what}"
        return await policy.instruct(work, instruction)


class NoForget(_Base):
    name = "no_forget"  # B0
    forgets_memory = False

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        return None


class MemoryDelete(_Base):
    name = "memory_delete"  # B1: the memory record is tombstoned; sessions are untouched

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        return None


class Ifc(_Base):
    """B8, FIDES-style information-flow control: flag the target's sources so no consequential tool call whose
    context holds them fires; the contaminated state itself is left as it is."""

    name = "ifc"
    flags_sources = True
    forgets_memory = False

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        return None


class IfcReplay(SelectiveReplay):
    name = "ifc_replay"  # B9: the sink policy and selective replay together
    flags_sources = True


class SemanticDeletion(_Base):
    """DeLLM's semantic-deletion baseline: delete every artifact (model outputs too) at least `min_similarity`
    similar to the query, follow no provenance, regenerate nothing. What it misses is what provenance finds: a
    reply that used the fact without repeating its words."""

    name = "semantic_deletion"
    targets: frozenset[str] | None = frozenset({"query"})
    matches_outputs = True

    async def apply(self, work: SessionWork, policy: ForgetPolicy) -> Change:
        drop = set(work.similar) | {i for i, content in work.located.edits.items() if content is None}
        return await policy.rewrite(work, drop=drop, edits={})


def _refuse_outputs_only(name: str, located: Located) -> None:
    if only_model_outputs(located):
        raise InvalidRequest(
            f"{name} sanitizes observations and regenerates what followed, and the target is only in model "
            "outputs: regenerating them from the same inputs reproduces them. Forget the observation it came from, "
            "or use delete_dependents."
        )


STRATEGIES: Final[Registry[ForgetStrategy]] = Registry(
    "forget strategy",
    SelectiveReplay(), FullReset(), DeleteDependents(), SanitizeNoReplay(), SourceRedaction(), SanitizedRebuild(),
    ForgetInstruction(), NoForget(), MemoryDelete(), Ifc(), IfcReplay(), SemanticDeletion(),
)
