"""What a forget computes, in tokens: the yardstick every plan and receipt measures against (a cold full reset)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.db.models import Artifact
from app.engine.protocol import KVEngine
from app.runtime.blocks import MODEL_KINDS


@dataclass(frozen=True)
class Yardstick:
    """What a transition sequence computes on one engine, so an estimate and the receipt it is set against count the
    same work. Every log token is computed once (prefilled, decoded or verified), and each reply adds its last
    sampled token: decoded and then prefilled to close the turn (runtime/engine_calls.py), or the stop token, sampled
    and never kept. An engine that `rereads_replies` (hf) also forwards each reply's sampled tokens again at the
    closing; there the last token is exact: a reply cut by `max_tokens` sampled no stop token. The yardstick counts
    that reread for every reply, as a reset that decodes them pays it: a reply that a replay's verification accepts
    whole is not forwarded again (its pass was the closing's, engine/hf_generation.py), so a verified replay computes
    less than its estimate by exactly those replies' sampled tokens."""

    rereads_replies: bool = False
    frame: int = 0  # the tokens of a reply block that were not sampled (the assistant header, the end of turn)

    @classmethod
    def of(cls, engine: KVEngine) -> Yardstick:
        """The engine's. Before it is up (its chat template unknown), every reply counted once."""
        if not engine.ready or not engine.rereads_replies:
            return cls()
        chat = engine.chat
        return cls(rereads_replies=True, frame=len(chat.assistant_header()) + len(chat.end_of_turn()))

    def run(self, token_count: int, rows: Iterable[Artifact]) -> int:
        """Tokens computed for a log of `token_count` tokens whose replies are among `rows`: what a cold full reset
        of that log pays."""
        replies = [r for r in rows if r.kind in MODEL_KINDS]
        if not self.rereads_replies:
            return token_count + len(replies)
        return token_count + sum(1 for r in replies if r.meta.get("finish_reason") != "length") + self.reread(replies)

    def reread(self, rows: Iterable[Artifact]) -> int:
        """The sampled tokens of the replies among `rows` that the closings forward a second time."""
        if not self.rereads_replies:
            return 0
        return sum(max(0, len(r.token_ids) - self.frame) for r in rows if r.kind in MODEL_KINDS)
