"""data subjects: the people data is about, and the sessions that name one

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07

Data-subject requests (issue 43; docs/subjects.md). A subject is the caller's id for a person, per tenant, with the
memory namespaces linked to them; a session names its subject at creation (`sessions.subject_id`, indexed for the
subject's lookups). Ids only: nothing a user wrote is stored here.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "subjects",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("memory_namespaces", postgresql.ARRAY(sa.String(length=200)), server_default="{}", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("erase_forget_id", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_subjects_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_subjects")),
    )
    op.add_column("sessions", sa.Column("subject_id", sa.String(length=200), nullable=True))
    op.create_index("ix_sessions_subject", "sessions", ["tenant_id", "subject_id"],
                    postgresql_where=sa.text("subject_id IS NOT NULL"))
    # Migration 0006's rule for text columns (tests/foundation/test_statistics.py): a subject id names a person.
    for table, column in (("subjects", "id"), ("subjects", "memory_namespaces"), ("sessions", "subject_id")):
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STATISTICS 0")


def downgrade() -> None:
    op.drop_index("ix_sessions_subject", table_name="sessions")
    op.drop_column("sessions", "subject_id")
    op.drop_table("subjects")
