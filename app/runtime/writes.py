"""What a transition writes, in the caller's transaction: the one writer of a `Step` (transition.py), for a live turn or
compaction (committed under the session's lease) and for every transition a forget's replay rebuilt (swapped in, in
the forget's commit)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.keys.content import Sealer
from app.runtime import checkpoints
from app.runtime.transition import Step
from app.sessions.repositories import artifact_search as search_repo
from app.sessions.repositories import artifacts as artifacts_repo
from app.sessions.repositories import sessions as sessions_repo
from app.sessions.repositories import tools as tools_repo


async def write_step(tx: AsyncSession, sealer: Sealer, session_id: str, step: Step) -> None:
    """Transition `step.turn`'s rows: what a compaction archived, the artifacts and their provenance edges, the
    checkpoints, the vectors a retrieval session stores, the tools' environment after it and the calls that fired."""
    if step.archived:
        await artifacts_repo.archive(tx, session_id, step.archived, step.turn)
    await artifacts_repo.insert_artifacts(tx, sealer, step.records.artifacts)
    await artifacts_repo.insert_edges(tx, step.records.edges)
    await sessions_repo.add_checkpoints(tx, session_id, checkpoint_rows(step.checkpoints))
    if step.embeddings:
        await search_repo.set_embeddings(tx, sealer, step.embeddings)
    if step.environment is not None:
        await tools_repo.save_environment(tx, sealer, session_id, step.turn, step.environment)
    await tools_repo.record_fired(tx, session_id, step.tools.fired_now)


def checkpoint_rows(marks: list[checkpoints.Boundary]) -> list[tuple[int, int, str]]:
    return [(b.turn, b.token_offset, b.manifest_sha256) for b in marks]
