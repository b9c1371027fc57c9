"""a session's settings, its tool environments and the OpenAI objects' client strings sealed at rest

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07

Erasure at rest, the session settings slice (docs/erasure-at-rest.md). Each erasure unit gets its own leaf, in the
clear beside its ciphertext so a session deletion or a forget collects the leaves it erases without opening anything:
- `sessions.settings_sealed`: the system prompt and the tool specs, one JSON document (they are one unit, erased
  with the session, or replaced together when a forget rewrites the system prompt);
- `env_snapshots.state_sealed`: one tool environment snapshot; `tenant_id` is added because the binding (and
  `lethe keys verify`) names the tenant, and the snapshot table had none;
- `openai_conversations.meta_sealed`: a conversation's metadata;
- `openai_responses.params_sealed`: a response's request parameters (tools, metadata, instructions' plan);
- `artifacts.meta_sealed`: the members of an artifact's `meta` a client wrote (a document's `source` label), under
  the artifact's own leaf (the rest of `meta` is ids and bookkeeping the database filters on).
The plaintext columns stay, nullable, for rows written before this version: reads use the sealed columns when present,
else the legacy plaintext, until the online migration seals them (issue 42, step 6). A row holds each in at most one
form, and a sealed row names its leaf. No planner statistics on the sealed columns (migration 0006's rule).

The merger re-chains `down_revision` after the forget-job (0019) and thread (0020) slices.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# table → (sealed column, plaintext columns it replaces)
_SEALED = {
    "sessions": ("settings_sealed", ("system_prompt", "tools")),
    "env_snapshots": ("state_sealed", ("state",)),
    "openai_conversations": ("meta_sealed", ("meta",)),
    "openai_responses": ("params_sealed", ("params",)),
}
# Plaintext columns that were NOT NULL (system_prompt always was nullable).
_NULLABLE = {"sessions": ("tools",), "env_snapshots": ("state",), "openai_conversations": ("meta",),
             "openai_responses": ("params",)}


def _checks(sealed: str, plain: Sequence[str]) -> dict[str, str]:
    return {
        "one_form": f"{sealed} IS NULL OR ({' AND '.join(f'{c} IS NULL' for c in plain)})",
        "sealed_with_leaf": f"({sealed} IS NULL) = (leaf IS NULL)",
    }


def upgrade() -> None:
    op.add_column("artifacts", sa.Column("meta_sealed", sa.LargeBinary(), nullable=True))
    op.execute("ALTER TABLE artifacts ALTER COLUMN meta_sealed SET STATISTICS 0")
    op.create_check_constraint(op.f("ck_artifacts_meta_with_leaf"), "artifacts", "meta_sealed IS NULL OR leaf IS NOT NULL")
    op.add_column("env_snapshots", sa.Column("tenant_id", sa.String(40), nullable=True))
    for table, (sealed, plain) in _SEALED.items():
        op.add_column(table, sa.Column(sealed, sa.LargeBinary(), nullable=True))
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {sealed} SET STATISTICS 0")
        op.add_column(table, sa.Column("leaf", sa.BigInteger(), nullable=True))
        for column in _NULLABLE[table]:
            op.alter_column(table, column, nullable=True)
        for name, condition in _checks(sealed, plain).items():
            op.create_check_constraint(op.f(f"ck_{table}_{name}"), table, condition)


def downgrade() -> None:
    # Sealed rows cannot go back to plaintext without their keys: a downgrade drops the sessions holding them (their
    # snapshots, conversations and responses go with them) and the rows sealed on their own.
    op.execute("DELETE FROM sessions WHERE leaf IS NOT NULL")
    op.execute("DELETE FROM sessions WHERE id IN (SELECT session_id FROM env_snapshots WHERE leaf IS NOT NULL)")
    op.execute("DELETE FROM openai_responses WHERE leaf IS NOT NULL")
    op.execute("DELETE FROM openai_conversations WHERE leaf IS NOT NULL")
    for table, (sealed, plain) in _SEALED.items():
        for name in _checks(sealed, plain):
            op.drop_constraint(op.f(f"ck_{table}_{name}"), table, type_="check")
        for column in _NULLABLE[table]:
            op.alter_column(table, column, nullable=False)
        op.drop_column(table, "leaf")
        op.drop_column(table, sealed)
    op.drop_column("env_snapshots", "tenant_id")
    op.execute("DELETE FROM sessions WHERE id IN (SELECT session_id FROM artifacts WHERE meta_sealed IS NOT NULL)")
    op.drop_constraint(op.f("ck_artifacts_meta_with_leaf"), "artifacts", type_="check")
    op.drop_column("artifacts", "meta_sealed")
