"""forget jobs' targets and reasons sealed at rest

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07

Erasure at rest, the forget-jobs slice (docs/erasure-at-rest.md). What a forget names is what it forgets: a text
span, a keyword or a query, and the client's (or a detector's) reason. They are stored only as ciphertext under one
leaf per job (`leaf`), which the job's end adds to its shred set (`shred_leaves`), so the request that asked for a
forget does not outlive it in any copy of the database. `target` stays, in the clear, holding only what is not
content: ids (session, artifact, memory namespace and key, the names memory_records keeps in the clear), a query's
threshold and the lengths of the sealed words (which the ciphertext's length reveals anyway). So `target` keeps its
NOT NULL: for a sealed row it is that id-only form, the placeholder every finished job already held. Rows written
before this version keep their plaintext (`leaf` NULL) and read as before.

`receipt_sealed` holds, under the same leaf, the receipt's members that are content while a job waits on its client
(`inputs`: the client's tool results; `pending`: the call the counterfactual makes, with its arguments); the clear
`receipt` keeps everything else (ids, counts, digests). Both members are gone once the job ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SEALED = ("target_sealed", "reason_sealed", "receipt_sealed")
_CHECKS = {
    "one_reason": "reason IS NULL OR reason_sealed IS NULL",
    "sealed_with_leaf":
        "(target_sealed IS NULL AND reason_sealed IS NULL AND receipt_sealed IS NULL) OR leaf IS NOT NULL",
}


def upgrade() -> None:
    for column in _SEALED:
        op.add_column("forget_jobs", sa.Column(column, sa.LargeBinary(), nullable=True))
        # Migration 0006's rule: no planner statistics on a column holding (sealed) user content.
        op.execute(f"ALTER TABLE forget_jobs ALTER COLUMN {column} SET STATISTICS 0")
    op.add_column("forget_jobs", sa.Column("leaf", sa.BigInteger(), nullable=True))
    for name, condition in _CHECKS.items():
        op.create_check_constraint(op.f(f"ck_forget_jobs_{name}"), "forget_jobs", condition)


def downgrade() -> None:
    for name in _CHECKS:
        op.drop_constraint(op.f(f"ck_forget_jobs_{name}"), "forget_jobs", type_="check")
    # A sealed target cannot go back to plaintext without its key: a downgrade drops the jobs still needing one (the
    # ended ones keep their id-only target and lose nothing readable).
    op.execute(
        "DELETE FROM forget_jobs WHERE target_sealed IS NOT NULL OR reason_sealed IS NOT NULL"
        " OR receipt_sealed IS NOT NULL"
    )
    op.drop_column("forget_jobs", "leaf")
    for column in _SEALED:
        op.drop_column("forget_jobs", column)
