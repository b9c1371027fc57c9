"""a tenant's leaf counter

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

Erasure at rest (docs/erasure-at-rest.md): every erasure unit's content is sealed under a leaf of its tenant's key
tree, and a leaf must never be handed out twice (a reused punctured leaf would be unreadable, a reused live one would
share its key with another unit). `next_leaf` is the first leaf no process has reserved yet; processes take blocks
from it (`UPDATE ... SET next_leaf = next_leaf + n RETURNING`, app/tenants/repository.py), each in a transaction of
its own, so a number once reserved is gone for good.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("next_leaf", sa.BigInteger(), server_default="0", nullable=False))
    op.create_check_constraint(op.f("ck_tenants_next_leaf_not_negative"), "tenants", "next_leaf >= 0")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_tenants_next_leaf_not_negative"), "tenants", type_="check")
    op.drop_column("tenants", "next_leaf")
