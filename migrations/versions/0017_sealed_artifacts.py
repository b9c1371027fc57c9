"""artifacts' content, token ids and embedding sealed at rest

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

Erasure at rest, the artifacts slice (docs/erasure-at-rest.md). An artifact's text (`content_sealed`), its token ids
(`token_ids_sealed`: little-endian int32) and its embedding (`embedding_sealed`: little-endian float32) are stored
only as ciphertext under one leaf per artifact (`leaf`, in the clear so a forget collects the leaves it erases
without opening a ciphertext). The plaintext columns stay, nullable, for rows written before this version: reads use
the sealed columns when present, else the legacy plaintext, until the online migration seals them (issue 42, step 6).
A row holds its text in exactly one of the two forms; tokens and embedding in at most one.

`meta` stays in the clear: it holds identifiers the database must filter on (a memory record's namespace and key,
the same names memory_records keeps in the clear; tool call ids and tool names) and the runtime's bookkeeping
(chunk recipe, finish reason); docs/erasure-at-rest.md lists what it may hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SEALED = ("content_sealed", "token_ids_sealed", "embedding_sealed")
_CHECKS = {
    "one_content": "(content IS NULL) <> (content_sealed IS NULL)",
    "one_token_ids": "token_ids IS NULL OR token_ids_sealed IS NULL",
    "one_embedding": "embedding IS NULL OR embedding_sealed IS NULL",
    "sealed_with_leaf": "(content_sealed IS NULL) = (leaf IS NULL)",
}


def upgrade() -> None:
    for column in _SEALED:
        op.add_column("artifacts", sa.Column(column, sa.LargeBinary(), nullable=True))
        # Migration 0006's rule: no planner statistics on a column holding (sealed) user content.
        op.execute(f"ALTER TABLE artifacts ALTER COLUMN {column} SET STATISTICS 0")
    op.add_column("artifacts", sa.Column("leaf", sa.BigInteger(), nullable=True))
    op.alter_column("artifacts", "content", nullable=True)
    op.alter_column("artifacts", "token_ids", nullable=True)
    for name, condition in _CHECKS.items():
        op.create_check_constraint(op.f(f"ck_artifacts_{name}"), "artifacts", condition)


def downgrade() -> None:
    for name in _CHECKS:
        op.drop_constraint(op.f(f"ck_artifacts_{name}"), "artifacts", type_="check")
    # Sealed artifacts cannot go back to plaintext without their keys: a downgrade drops the sessions holding them.
    op.execute("DELETE FROM sessions WHERE id IN (SELECT session_id FROM artifacts WHERE leaf IS NOT NULL)")
    op.alter_column("artifacts", "token_ids", nullable=False)
    op.alter_column("artifacts", "content", nullable=False)
    op.drop_column("artifacts", "leaf")
    for column in _SEALED:
        op.drop_column("artifacts", column)
