"""retention: a memory namespace's own override of the tenant's (and its subjects') memory_max_age_days

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07

Retention (issue 43; docs/subjects.md, "Retention"). `retention_namespaces` holds one row per namespace whose keys
have a limit of their own: for a key of that namespace it wins over the overrides of the subjects the namespace is
linked to, which win over the tenant's default. A NULL limit defers (to the subjects', then the tenant's). A
namespace has no sessions, so no `sessions_max_idle_days`. A separate table, not a column on `retention_policies`:
that table's key is (tenant_id, subject_id), and a row that is one or the other would need a nullable key and a
check. The namespace is caller's text that can name a person: no planner statistics (migration 0006's rule).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "retention_namespaces",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("namespace", sa.String(length=200), nullable=False),
        sa.Column("memory_max_age_days", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_retention_namespaces_tenant_id_tenants"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "namespace", name=op.f("pk_retention_namespaces")),
    )
    op.execute("ALTER TABLE retention_namespaces ALTER COLUMN namespace SET STATISTICS 0")


def downgrade() -> None:
    op.drop_table("retention_namespaces")
