"""The context policies: one object per policy, carrying its three halves, and the one registry of them.

A session's `context_policy` names one; the registry (`build_policies`, built once by the composition root)
resolves it once per unit of work, and everything after that uses the object. Only the object knows its policy:

- `provenance` (runtime/provenance.py): which artifacts a model output depends on, stored as edges;
- `transitions` (runtime/policies/full.py, runtime/policies/retrieval.py): what a reply's context is and how the engine
  computes it, for every transition the one transition function runs (runtime/transition.py);
- `forget` (forget/per_policy.py): how a forget is carried out in such a session, and which strategies it supports;
- `check`: which session configurations it can honour (tools need a tool loop, a token budget a growing prompt).

`full`: the whole prefix is the context, held by the engine's cache. `retrieval` (DeLLM): the preamble and the
top-k stored messages most similar to the turn's question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.db.models import AgentSession
from app.errors import InvalidRequest
from app.forget.per_policy import ForgetPolicy, FullForget, RetrievalForget
from app.registry import Registry
from app.runtime.policies.full import FullTransitions
from app.runtime.policies.retrieval import RetrievalTransitions
from app.runtime.provenance import FullContext, Provenance, RetrievedContext
from app.runtime.transition import TransitionHalf


@dataclass(frozen=True)
class ContextPolicy:
    name: str
    provenance: Provenance  # the parents rule of transitions that retrieved nothing (creation, empty transitions)
    transitions: TransitionHalf
    forget: ForgetPolicy  # also says which forget strategies it supports (`forget.supports`)
    runs_tools: bool  # a reply may continue through tool calls (a retrieval reply is one prompt, with no loop)
    prompt_grows: bool  # the prompt is the growing log, so a token budget can trigger compaction

    def check(self, tools: Sequence[object], compaction: Mapping[str, Any]) -> None:
        """What a session of this policy cannot honour is refused, not silently ignored."""
        if tools and not self.runs_tools:
            raise InvalidRequest(
                f"tools need context_policy: full (a {self.name} session answers each turn in one prompt)"
            )
        if compaction.get("max_tokens") and not self.prompt_grows:
            raise InvalidRequest(
                f"compaction.max_tokens needs context_policy: full (a {self.name} session's prompt does not grow); "
                f"POST /compact still summarizes a {self.name} session"
            )


class Policies(Registry[ContextPolicy]):
    """The registry. The composition root (app/container.py) builds it and hands it to the sessions, the runtime and
    the forget machinery, none of which imports it: they sit below the objects that join their halves."""

    def of(self, row: AgentSession) -> ContextPolicy:
        return self.named(row.context_policy)


def build_policies() -> Policies:
    return Policies(
        "context policy",
        ContextPolicy("full", FullContext(), FullTransitions(), FullForget(), runs_tools=True, prompt_grows=True),
        ContextPolicy(
            "retrieval", RetrievedContext(), RetrievalTransitions(), RetrievalForget(),
            runs_tools=False, prompt_grows=False,
        ),
    )
