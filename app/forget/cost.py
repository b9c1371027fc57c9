"""What a forget computes, in tokens: the yardstick every plan and receipt measures against (a cold full reset)."""

from __future__ import annotations

from collections.abc import Iterable

from app.db.models import Artifact
from app.runtime.blocks import MODEL_KINDS


def compute_cost(token_count: int, replies: int) -> int:
    """Tokens a transition sequence computes for a log of `token_count` tokens holding `replies` replies: every token
    once (prefilled or decoded), plus the last sampled token of each reply, decoded and then prefilled to close the
    turn (transition.py). A cold full reset pays exactly this for the rebuilt log."""
    return token_count + replies


def replies_in(rows: Iterable[Artifact]) -> int:
    return sum(1 for r in rows if r.kind in MODEL_KINDS)


def full_reset_estimate(token_count: int, rows: Iterable[Artifact]) -> int:
    """What a cold full reset of a log of `token_count` tokens whose artifacts are `rows` computes."""
    return compute_cost(token_count, replies_in(rows))
