"""retention: per-tenant limits on how long sessions and memory values are kept, per-subject overrides, and the
sweep's lease

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07

Retention (issue 43; docs/subjects.md, "Retention"). `retention_policies` holds the tenant's default (subject_id '')
and each subject's override; a NULL limit keeps forever (or defers to the default). `retention_sweeps` is one row per
tenant with a policy: when its next sweep is due and which process holds it (a lease, so every process's forget
worker may run sweeps and each runs once). Ids and numbers only.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "retention_policies",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("subject_id", sa.String(length=200), server_default="", nullable=False),
        sa.Column("sessions_max_idle_days", sa.Integer(), nullable=True),
        sa.Column("memory_max_age_days", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_retention_policies_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "subject_id", name=op.f("pk_retention_policies")),
    )
    op.create_table(
        "retention_sweeps",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("next_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("lease_owner", sa.String(length=80), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_forget_id", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_retention_sweeps_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_retention_sweeps")),
    )
    # Migration 0006's rule for text columns (tests/foundation/test_statistics.py): a subject id names a person.
    op.execute("ALTER TABLE retention_policies ALTER COLUMN subject_id SET STATISTICS 0")


def downgrade() -> None:
    op.drop_table("retention_sweeps")
    op.drop_table("retention_policies")
