"""The context policies a session can have, by the name its row stores: chosen once per transition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from app.db.models import AgentSession
from app.sessions.policies.base import TurnPolicy
from app.sessions.policies.full import FullTurns
from app.sessions.policies.retrieval import RetrievalTurns

POLICIES: Final[Mapping[str, TurnPolicy]] = {p.name: p for p in (FullTurns(), RetrievalTurns())}


def policy_of(row: AgentSession) -> TurnPolicy:
    return POLICIES[row.context_policy]
