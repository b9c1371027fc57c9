"""What a committed transition writes besides its artifacts' content: edges, checkpoints, the session's counters."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import AgentSession
from app.db.repositories import artifacts as artifacts_repo
from app.db.repositories import sessions as sessions_repo
from app.runtime import checkpoints
from app.runtime.compaction import Compaction
from app.runtime.records import TransitionRecords


async def write_transition(tx: AsyncSession, row: AgentSession, turn: int, records: TransitionRecords) -> None:
    """Transition `turn`'s records, its checkpoints and the session's new counters (mirrored on `row`)."""
    await artifacts_repo.insert_artifacts(tx, records.artifacts)
    await artifacts_repo.insert_edges(tx, records.edges)
    marks = checkpoints.for_transition(
        row.checkpoint_policy, turn, records.kinds, records.manifest_before, records.manifest_after
    )
    await sessions_repo.add_checkpoints(tx, row.id, checkpoint_rows(marks))
    await sessions_repo.record_transition(tx, row.id, turns=turn, token_count=records.token_count)
    row.turns, row.token_count = turn, records.token_count


async def write_compaction(tx: AsyncSession, row: AgentSession, turn: int, done: Compaction) -> None:
    """A compaction transition of a full session: the older turns archived, the summary and the kept copies added."""
    await artifacts_repo.archive(tx, row.id, done.archived, turn)
    await artifacts_repo.insert_artifacts(tx, done.rows)
    await artifacts_repo.insert_edges(tx, done.edges)
    log = await artifacts_repo.load_log(tx, row.id)
    manifest = [(e.id, e.token_start, e.token_end) for e in log]  # the live prompt after the compaction
    marks = checkpoints.for_transition(row.checkpoint_policy, turn, ["summary"], [], manifest)
    await sessions_repo.add_checkpoints(tx, row.id, checkpoint_rows(marks))
    await sessions_repo.record_transition(tx, row.id, turns=turn, token_count=done.token_count)
    row.turns, row.token_count = turn, done.token_count


def checkpoint_rows(marks: list[checkpoints.Boundary]) -> list[tuple[int, int, str]]:
    return [(b.turn, b.token_offset, b.manifest_sha256) for b in marks]
