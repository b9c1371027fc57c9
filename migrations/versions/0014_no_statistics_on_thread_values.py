"""no planner statistics on thread values

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

Migration 0006's rule for the tables 0012 added: a LangGraph checkpoint, its channel values and pending writes are
a user's messages, serialized (bytea), and a checkpoint's metadata may quote them (jsonb). ANALYZE would copy a
sample of them into `pg_statistic`, where a deleted thread or a forgotten message would survive; none of them is
filtered on in a way statistics help (run_id lookups go through the expression index, whose statistics hold run ids
only). The same two steps as 0006: `SET STATISTICS 0`, and the column re-declared as its own type, which drops any
statistics gathered before this migration ran.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

THREAD_VALUES = {
    "thread_checkpoints": ("checkpoint", "metadata", "versions"),
    "thread_blobs": ("blob",),
    "thread_writes": ("blob",),
}

# 0006's statement, loaded from its file as Alembic loads revisions (migrations/ is not an importable package).
_spec = importlib.util.spec_from_file_location("_0006", Path(__file__).with_name("0006_no_statistics_on_user_text.py"))
assert _spec is not None and _spec.loader is not None
_no_statistics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_no_statistics)


def upgrade() -> None:
    for table, columns in THREAD_VALUES.items():
        _no_statistics._alter(table, columns, 0, drop_existing=True)


def downgrade() -> None:
    for table, columns in THREAD_VALUES.items():
        _no_statistics._alter(table, columns, -1, drop_existing=False)
