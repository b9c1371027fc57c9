"""The context policies: one object per policy, carrying its three halves, and the one registry of them.

A session's `context_policy` names one; `POLICIES.of(session)` resolves it once per unit of work, and everything
after that uses the object:

- `provenance` (runtime/provenance.py): which artifacts a model output depends on, stored as edges;
- `turns` (runtime/policies/full.py, runtime/policies/retrieval.py): what a reply's context is and how the engine
  computes it, for every transition the one transition function runs (runtime/transition.py);
- `forget` (forget/per_policy.py): how a forget is carried out in such a session, for every strategy.

`full`: the whole prefix is the context, held by the engine's cache. `retrieval` (DeLLM): the preamble and the
top-k stored messages most similar to the turn's question.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from app.db.models import AgentSession
from app.errors import InvalidRequest
from app.forget.per_policy import ForgetPolicy, FullForget, RetrievalForget
from app.runtime.policies.full import FullTurns
from app.runtime.policies.retrieval import RetrievalTurns
from app.runtime.provenance import FullContext, Provenance, RetrievedContext
from app.runtime.transition import Turns


@dataclass(frozen=True)
class ContextPolicy:
    name: str
    provenance: Provenance  # the parents rule of transitions that retrieved nothing (creation, empty transitions)
    turns: Turns
    forget: ForgetPolicy


class Policies:
    """The registry (a `PolicyLookup` for the runtime and the sessions, which receive it from the composition
    root rather than import it: they sit below the forget halves)."""

    def __init__(self, *policies: ContextPolicy) -> None:
        self._by_name: Final[Mapping[str, ContextPolicy]] = {p.name: p for p in policies}

    def of(self, row: AgentSession) -> ContextPolicy:
        return self.named(row.context_policy)

    def named(self, name: str) -> ContextPolicy:
        try:
            return self._by_name[name]
        except KeyError:
            raise InvalidRequest(f"no context policy {name!r}; one of {', '.join(self._by_name)}") from None

    @property
    def names(self) -> list[str]:
        return list(self._by_name)


POLICIES: Final = Policies(
    ContextPolicy("full", FullContext(), FullTurns(), FullForget()),
    ContextPolicy("retrieval", RetrievedContext(), RetrievalTurns(), RetrievalForget()),
)
