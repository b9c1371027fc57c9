"""Provenance: which artifacts a model call depends on, stored as edges (one half of a context policy; the policy
object that carries it is app/policies.py).

`full`: the context of a model call is the whole prefix of the log, the conservative taint
of Lemma 2. Recording an edge from every prefix artifact to every reply would cost O(n) edges per turn and O(n²) per
session; we store the *transitive reduction* instead. The parents of a reply are

    every artifact added since the previous model output, plus that previous model output

(for the first reply: everything from the system block on). Reachability is unchanged: any earlier artifact either
is a parent or was added before the previous model output, which by induction reaches it, and that output is a
parent. So `descendants(a)` over the stored edges is exactly the set of replies whose context held `a`, at
O(new artifacts) edges per turn. The API's `parents` are these stored parents.

`retrieval` (DeLLM): a reply's context is the session's preamble (system prompt, instructions), the messages retrieval
picked for it and its own turn's observations, and its parents are exactly those: no reduction applies, because the
context is not a prefix. So `descendants(m)` is DeLLM's Dep(m): only replies that actually saw m (or saw a reply that
did). The retrieval itself is runtime/retrieval.py; this class only turns its choice into parents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from app.runtime.blocks import MODEL_KINDS


@dataclass(frozen=True)
class Node:
    """A stored or about-to-be-stored artifact, as provenance sees it."""

    id: str
    kind: str
    source_ids: tuple[str, ...]


class Provenance(Protocol):
    name: str

    def reply_parents(self, prefix: Sequence[Node], new: Sequence[Node]) -> list[Node]:
        """The parents of a model output produced after `prefix` (stored, in log order) and `new` (this
        transition's observations, in order)."""
        ...


class FullContext:
    name = "full"

    def reply_parents(self, prefix: Sequence[Node], new: Sequence[Node]) -> list[Node]:
        tail: list[Node] = []
        for node in reversed(prefix):  # O(artifacts since the previous model output), not O(prefix)
            tail.append(node)
            if node.kind in MODEL_KINDS:
                break
        tail.reverse()
        return [*tail, *new]


class RetrievedContext:
    """The parents of one reply of a retrieval session: `preamble` and `retrieved` ids (found in the prefix), then
    the transition's own observations. Without ids (a transition that samples nothing) it is only the new ones."""

    name = "retrieval"

    def __init__(self, preamble: Sequence[str] = (), retrieved: Sequence[str] = ()) -> None:
        self.wanted = {*preamble, *retrieved}

    def reply_parents(self, prefix: Sequence[Node], new: Sequence[Node]) -> list[Node]:
        return [*(n for n in prefix if n.id in self.wanted), *new]


def union_sources(parents: Sequence[Node]) -> list[str]:
    """A model output carries every source of its context; under the reduction, its parents' sources are that."""
    seen: dict[str, None] = {}
    for node in parents:
        for source in node.source_ids:
            seen.setdefault(source, None)
    return list(seen)
