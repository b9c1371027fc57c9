"""Algorithm 1, lines 2-4: the closure with the reason each artifact is in it, and the restore point.

The closure I(z) is every source and everything whose context reached one, found over the stored provenance edges
(transitions ≥ τ only: nothing earlier can descend from a source that entered at τ). Each artifact carries the
reason it is there, `target` or `context held <parent>`, so a dry run can show a user *why* an artifact would go.

The restore point is the latest checkpoint strictly before τ whose manifest still matches the live log (a checkpoint
whose prefix was rewritten since, by another forget, is skipped), or nothing at all (replay from the empty log).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from app.db.models import Artifact, Checkpoint
from app.runtime.checkpoints import manifest_sha256


@dataclass(frozen=True)
class ClosureEntry:
    artifact_id: str
    kind: str
    turn: int
    why: str  # "target", or "context held art_..." (the parent it was reached through)


@dataclass(frozen=True)
class Restore:
    turn: int  # transitions ≤ turn are kept as they are; -1: nothing is kept
    token_offset: int  # the log length there: the cache is cropped to it
    checkpoint_id: str | None


def closure_of(
    sources: Sequence[str], edges: Iterable[tuple[str, str]], rows: Sequence[Artifact]
) -> list[ClosureEntry]:
    """Breadth-first over (parent, child) edges from the sources; in log order."""
    children: dict[str, list[str]] = {}
    for parent, child in edges:
        children.setdefault(parent, []).append(child)
    why: dict[str, str] = {s: "target" for s in sources}
    queue = deque(sources)
    while queue:
        node = queue.popleft()
        for child in children.get(node, ()):
            if child not in why:
                why[child] = f"context held {node}"
                queue.append(child)
    return [ClosureEntry(r.id, r.kind, r.turn, why[r.id]) for r in rows if r.id in why]


def restore_point(checkpoints: Sequence[Checkpoint], rows: Sequence[Artifact], tau: int) -> Restore:
    for checkpoint in sorted(checkpoints, key=lambda c: c.turn, reverse=True):
        if checkpoint.turn >= tau:
            continue
        prefix = [(r.id, r.token_start, r.token_end) for r in live_after(rows, checkpoint.turn)]
        end = prefix[-1][2] if prefix else 0
        if end == checkpoint.token_offset and manifest_sha256(prefix) == checkpoint.manifest_sha256:
            return Restore(checkpoint.turn, checkpoint.token_offset, checkpoint.id)
    return Restore(-1, 0, None)


def live_after(rows: Sequence[Artifact], turn: int) -> list[Artifact]:
    """The live prompt as it stood at the end of transition `turn` (compactions up to `turn` applied)."""
    return [r for r in rows if r.turn <= turn and (r.archived_by is None or r.archived_by > turn)]
