"""session cache generation

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

`sessions.cache_generation`: part of the session's engine cache salt (app/runtime/salts.py). A forget that leaves a
log an extension could take back to the forgotten prefix-cache blocks bumps it, so the session's next requests carry
a new salt and the blocks that held the target are unreachable until vLLM evicts them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("cache_generation", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("sessions", "cache_generation")
