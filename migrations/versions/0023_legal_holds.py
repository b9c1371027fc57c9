"""legal holds: what must not be erased while a hold stands, and who placed and released it

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07

Legal holds (issue 43; docs/subjects.md, "Legal holds"). A hold covers exactly one of a subject, a session or a
memory namespace; while it stands an erasure of what it covers answers 409 `legal_hold`. `hold_events` is the audit
trail (placed, released, deferred: which API key, when); `hold_deferrals` the subject erasures that skipped what a
hold covered, run again when it is released. Ids only, and the operator's reason for the hold: a hold is the record
that must survive erasure, so its reason is not content a forget reaches (docs/subjects.md says so).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "holds",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("subject_id", sa.String(length=200), nullable=True),
        sa.Column("session_id", sa.String(length=40), nullable=True),
        sa.Column("namespace", sa.String(length=200), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("created_by", sa.String(length=40), nullable=True),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("released_by", sa.String(length=40), nullable=True),
        sa.CheckConstraint(
            "(subject_id IS NOT NULL)::int + (session_id IS NOT NULL)::int + (namespace IS NOT NULL)::int = 1",
            name=op.f("ck_holds_one_scope"),
        ),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_holds_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_holds")),
    )
    op.create_index("ix_holds_standing", "holds", ["tenant_id"], postgresql_where=sa.text("released_at IS NULL"))
    op.create_table(
        "hold_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("hold_id", sa.String(length=40), nullable=False),
        sa.Column("action", sa.String(length=20), nullable=False),
        sa.Column("key_id", sa.String(length=40), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False),
        sa.ForeignKeyConstraint(["tenant_id", "hold_id"], ["holds.tenant_id", "holds.id"],
                                name=op.f("fk_hold_events_tenant_id_holds"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hold_events")),
    )
    op.create_index("ix_hold_events_hold", "hold_events", ["tenant_id", "hold_id", "id"])
    op.create_table(
        "hold_deferrals",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("hold_id", sa.String(length=40), nullable=False),
        sa.Column("subject_id", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id", "hold_id"], ["holds.tenant_id", "holds.id"],
                                name=op.f("fk_hold_deferrals_tenant_id_holds"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "hold_id", "subject_id", name=op.f("pk_hold_deferrals")),
    )
    # Which subjects link a namespace: asked by every memory forget (a hold on a linking subject covers it) and by
    # retention for every live key; a containment probe on this index instead of a scan of the tenant's subjects.
    op.create_index("ix_subjects_namespaces", "subjects", ["memory_namespaces"], postgresql_using="gin")
    # Migration 0006's rule for text columns (tests/foundation/test_statistics.py).
    for table, column in (("holds", "subject_id"), ("holds", "namespace"), ("holds", "reason"),
                          ("hold_deferrals", "subject_id"), ("hold_events", "detail")):
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STATISTICS 0")


def downgrade() -> None:
    op.drop_index("ix_subjects_namespaces", table_name="subjects")
    op.drop_table("hold_deferrals")
    op.drop_index("ix_hold_events_hold", table_name="hold_events")
    op.drop_table("hold_events")
    op.drop_index("ix_holds_standing", table_name="holds")
    op.drop_table("holds")
